"""SigLIP and SigLIP 2 image towers (issue 50, item 2) predict what their own library computes.

References: transformers in-process (``SiglipVisionModel``'s ``pooler_output``, ``SiglipModel.get_image_features``,
``SiglipForImageClassification``'s logits, on its own ``SiglipImageProcessorPil``); timm in the reference environment
(``tests/helpers/library_reference.py ... siglip``: ``vit_*_siglip_*`` built and saved by timm, read back by timm,
``model(x)`` on ``create_transform(**resolve_data_config(model=model))``). Every model is the real structure at a tiny
width with random weights: no class token, the attention-pooling head (a probe attending over the patch tokens, then
its norm and MLP), so400m/14 at 384 px (off the patch grid). Ours: ``vitdeploy export`` with the defaults (FP32
graphs), then ``vitdeploy predict --json`` on the photo files: the vectors (or class probabilities) must be the
library's within 1e-4.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.library_fidelity import PROB_TOL, assert_pixels, export, photo_files, photos, run_reference  # noqa: F401
from helpers.library_reference import randomize_
from helpers.siglip_reference import SIGLIP_CASES
from PIL import Image

from vitdeploy.base.errors import CheckpointError
from vitdeploy.cli import main as cli_main
from vitdeploy.model import load_checkpoint
from vitdeploy.runtime.postprocess import softmax
from vitdeploy.runtime.predictor import Predictor

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VECTOR_TOL = 1e-4  # FP32: the library's vector, element by element
FP32_ONLY = {"fp16": {"enabled": False}, "int8": {"enabled": False}, "batch": {"min": 1, "opt": 2, "max": 4}}


def predict_json(artifacts: Path, photos: Path, backend: str, top_k: int = 1) -> list[dict]:  # noqa: F811
    """`vitdeploy predict PHOTOS -a ART -b BACKEND --json`: one record per photo, in the photos' (name) order."""
    args = ["predict", str(photos), "-a", str(artifacts), "-b", backend, "--json", "-k", str(top_k)]
    res = CliRunner().invoke(cli_main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    records = sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda r: Path(r["path"]).name)
    assert [Path(r["path"]).name for r in records] == [p.name for p in photo_files(photos)]
    return records


def assert_vectors(records: list[dict], expected: np.ndarray, what: str) -> None:
    vectors = np.array([r["embedding"] for r in records], dtype=np.float32)
    assert vectors.shape == expected.shape, what
    diff = float(np.abs(vectors - expected).max())
    assert diff <= VECTOR_TOL, f"{what}: max |vector diff| {diff}"


def assert_probabilities(records: list[dict], logits: np.ndarray, what: str) -> None:
    probs = np.zeros_like(logits)
    for row, rec in zip(probs, records):
        for entry in rec["top_k"]:
            row[entry["index"]] = entry["score"]
    diff = float(np.abs(probs - softmax(logits)).max())
    assert diff <= PROB_TOL and (probs.argmax(1) == logits.argmax(1)).all(), f"{what}: max |prob diff| {diff}"


# --------------------------------------------------------------------------- transformers


def _quiet():
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _vision(image: int = 32, patch: int = 8, width: int = 64, heads: int = 2) -> dict:
    return dict(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=heads,
        image_size=image,
        patch_size=patch,
    )


_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)

#: case -> (the model, its image size): the tower alone, a whole SiglipModel (text tower beside), so400m/14's
#: 384 px off the patch grid (a 27 x 27 grid), and the classifier (mean token, its pooling head unused)
HF_CASES = {
    "vision-model": lambda: (transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**_vision())), 32),
    "siglip-model": lambda: (
        transformers.SiglipModel(transformers.SiglipConfig(vision_config=_vision(), text_config=_TEXT)),
        32,
    ),
    "so400m14-384": lambda: (
        transformers.SiglipModel(transformers.SiglipConfig(vision_config=_vision(384, 14, 32, 2), text_config=_TEXT)),
        384,
    ),
    "classifier": lambda: (
        transformers.SiglipForImageClassification(
            transformers.SiglipConfig(vision_config=_vision(), text_config=_TEXT, num_labels=3)
        ),
        32,
    ),
}


def _hf_reference(case: str, folder: Path, photos: Path) -> tuple[np.ndarray, np.ndarray]:  # noqa: F811
    """Save the case's model and processor as transformers does; (pixels, pooler_output or logits) on the photos."""
    _quiet()
    build, size = HF_CASES[case]()
    model = randomize_(build, 50 + len(case))
    processor = transformers.SiglipImageProcessorPil(size={"height": size, "width": size})
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    pixels = np.stack(
        [
            processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
            for p in photo_files(photos)
        ]
    )
    x = torch.from_numpy(pixels)
    with torch.no_grad():
        if case == "classifier":
            out = model(pixel_values=x).logits
        elif isinstance(model, transformers.SiglipModel):
            out = model.get_image_features(pixel_values=x).pooler_output
        else:
            out = model(pixel_values=x).pooler_output
    return pixels, out.numpy()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("case", list(HF_CASES))
def test_transformers_siglip_tower_predicts_what_transformers_computes(case, photos, tmp_path):  # noqa: F811
    pixels_ref, ref = _hf_reference(case, tmp_path / "ckpt", photos)
    art, manifest = export(tmp_path / "ckpt", photos, tmp_path / "art", export=FP32_ONLY)
    vit = manifest["model"]["vit"]
    assert vit["class_token"] is False and vit["pool"] == ("avg" if case == "classifier" else "map")
    assert vit.get("drop_remainder", False) is (case == "so400m14-384")
    assert manifest["preprocess"]["interpolation"] == "bicubic" and manifest["preprocess"]["mean"] == [0.5] * 3
    with Predictor.from_artifacts(art, backend="ort") as predictor:
        assert_pixels(predictor.preprocess(photo_files(photos)), pixels_ref, f"{case}: SiglipImageProcessor")
    backends = ("ort", "torch") if case == "so400m14-384" else ("ort",)  # torch: the weights and model.json
    for backend in backends:
        if case == "classifier":
            assert manifest["labels"] == ["LABEL_0", "LABEL_1", "LABEL_2"]
            assert_probabilities(predict_json(art, photos, backend, top_k=3), ref, f"{case} {backend}")
        else:
            assert manifest["output"]["kind"] == "embedding"
            assert_vectors(predict_json(art, photos, backend), ref, f"{case} {backend}")


def test_siglip_answers_at_other_sizes_as_transformers_interpolates(tmp_path):
    """export.image_sizes: the patch table resampled to each input's grid as SigLIP's interpolate_pos_encoding does
    (bicubic, not antialiased; no class-token row), at the base size, below it and above it."""
    _quiet()
    model = randomize_(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**_vision())), 60)
    model.save_pretrained(tmp_path)
    loaded = load_checkpoint(tmp_path, image_sizes=(16, 32, 48, 64))
    assert loaded.config.pos_resample == "bicubic" and loaded.config.pool == "map"
    for side in (16, 32, 48, 64):  # 16: a smaller grid, where antialiasing would differ
        x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
        with torch.no_grad():
            ref = model(pixel_values=x, interpolate_pos_encoding=True).pooler_output
            ours = loaded.model(x)
        assert float((ours - ref).abs().max()) <= VECTOR_TOL, side


def test_naflex_siglip2_is_refused_in_one_line_naming_why(tmp_path):
    """transformers' Siglip2VisionModel (NaFlex: a variable patch count per image): refused before any weight is
    read, naming the fixed-resolution checkpoints that load."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "siglip2", "vision_config": {}}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    message = str(err.value)
    assert "\n" not in message and "NaFlex" in message and "max_num_patches" in message
    assert "google/siglip2-*-patch16-224/256/384/512" in message


def test_timm_naflexvit_is_refused_in_one_line_naming_why(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "naflexvit_so400m_patch16_siglip"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="timm's NaFlexViT: it takes each image at its own aspect ratio"):
        load_checkpoint(tmp_path)


def test_siglip_without_its_pooling_head_is_refused(tmp_path):
    """vision_use_head false: transformers' pooler_output is None, so there is no embedding to reproduce."""
    _quiet()
    cfg = transformers.SiglipVisionConfig(**_vision(), vision_use_head=False)
    transformers.SiglipVisionModel(cfg).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="vision_use_head is false.*pooler_output is None"):
        load_checkpoint(tmp_path)


def test_siglip_vision_config_values_are_checked_naming_the_nested_key(tmp_path):
    config = {"model_type": "siglip", "vision_config": {**_vision(), "num_attention_heads": 0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="'vision_config.num_attention_heads' = 0"):
        load_checkpoint(tmp_path)


# --------------------------------------------------------------------------- timm


@pytest.fixture(scope="module")
def timm_siglip(photos, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("timm-siglip")
    return out, run_reference(photos, out, "siglip")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("case", [c[0] for c in SIGLIP_CASES])
def test_timm_siglip_tower_predicts_what_timm_computes(case, timm_siglip, photos, tmp_path):  # noqa: F811
    out, cases = timm_siglip
    with np.load(out / case / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    art, manifest = export(out / case / cases[case]["checkpoint"], photos, tmp_path / "art", export=FP32_ONLY)
    vit, side = manifest["model"]["vit"], cases[case]["data_config"]["input_size"][-1]
    assert vit["pool"] == "map" and vit["class_token"] is False and vit["image_size"] == side
    assert vit.get("drop_remainder", False) is (side % vit["patch_size"] != 0)
    with Predictor.from_artifacts(art, backend="ort") as predictor:
        assert_pixels(predictor.preprocess(photo_files(photos)), ref["pixels"], f"{case}: timm's transform")
    if manifest["output"]["kind"] == "embedding":
        assert_vectors(predict_json(art, photos, "ort"), ref["logits"], case)
    else:
        assert_probabilities(predict_json(art, photos, "ort", top_k=10), ref["logits"], case)
