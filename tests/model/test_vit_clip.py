"""CLIP image towers give their library's embedding (issue 50): timm ``vit_*_clip_*``, transformers'
``CLIPVisionModelWithProjection`` / ``CLIPVisionModel`` / the vision half of a ``CLIPModel``, and OpenCLIP.

Each tower is a tiny random-weight model of the real configuration family (the norm before the blocks, LayerNorm
eps 1e-5, QuickGELU where the family has it, the final norm on the class token, the bias-free projection), saved
as its library saves it. References: timm and OpenCLIP run in the reference environment
(``tests/helpers/clip_reference.py``: ``model(x)``, ``encode_image``, each on its own preprocessing's pixels);
transformers runs here (``get_image_features`` / ``image_embeds`` / ``pooler_output`` on its PIL processor's
pixels). Ours: ``vitdeploy export`` with the defaults (the tower is an embedding model), then ``vitdeploy predict
--json`` on the photo files: the vectors must be the library's within 1e-4 (FP32). The last test takes a tiny
tower through the FP16 and INT8 stages and their gates (cosine and recall@k on the demo images).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.library_fidelity import assert_pixels, export, photo_files, photos, run_reference  # noqa: F401
from helpers.library_reference import randomize_
from PIL import Image

from vitdeploy.cli import main as cli_main
from vitdeploy.runtime.predictor import Predictor

pytestmark = pytest.mark.integration

VECTOR_TOL = 1e-4  # FP32, as the classifiers' logits (helpers/library_fidelity.LOGIT_TOL)
FP32_ONLY = {"fp16": {"enabled": False}, "int8": {"enabled": False}, "batch": {"min": 1, "opt": 2, "max": 4}}


def predict_vectors(artifacts: Path, photos: Path, backend: str = "ort") -> np.ndarray:  # noqa: F811
    """``vitdeploy predict --json`` on the photo files: their vectors, in the photos' (sorted) order."""
    res = CliRunner().invoke(
        cli_main, ["predict", str(photos), "-a", str(artifacts), "-b", backend, "--json"], catch_exceptions=False
    )
    assert res.exit_code == 0, res.stderr
    records = {Path(r["path"]).name: r["embedding"] for r in map(json.loads, res.stdout.splitlines())}
    return np.array([records[p.name] for p in photo_files(photos)], dtype=np.float32)


def assert_vectors(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape, what
    diff = float(np.abs(ours - theirs).max())
    assert diff <= VECTOR_TOL, f"{what}: max |vector diff| {diff}"


# --------------------------------------------------------------------------- timm and OpenCLIP (.venv-ref)


@pytest.fixture(scope="module")
def clip_reference(photos, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("clip-reference")
    return out, run_reference(photos, out, "clip")


def _reference(clip_reference, case: str) -> tuple[Path, dict[str, np.ndarray]]:
    out, cases = clip_reference
    with np.load(out / case / "reference.npz") as data:
        return out / case / cases[case]["checkpoint"], {k: data[k] for k in data.files}


#: case -> (vit fields the manifest must say, the format)
TOWERS = {
    "timm_clip_quickgelu": ({"act": "quick_gelu", "norm_pre": True, "proj_dim": 24, "layer_norm_eps": 1e-5}, "timm"),
    "timm_clip_gelu_b32": ({"act": "gelu", "norm_pre": True, "proj_dim": 24, "patch_size": 32}, "timm"),
    "open_clip_quickgelu": ({"act": "quick_gelu", "norm_pre": True, "proj_dim": 24, "heads": 2}, "open_clip"),
    "open_clip_gelu_squash": ({"act": "gelu", "norm_pre": True, "proj_dim": 24, "patch_size": 32}, "open_clip"),
    # no ln_pre, layer scale, average pooling with ln_post after it (fc_norm), eps 1e-6 (OpenCLIP's CLIPA shape)
    "open_clip_avg_ls": (
        {"pool": "avg", "fc_norm": True, "layer_scale": True, "layer_norm_eps": 1e-6, "proj_dim": 24},
        "open_clip",
    ),
}


@pytest.mark.parametrize("case", list(TOWERS))
def test_timm_and_open_clip_towers_predict_their_librarys_vectors(clip_reference, case, photos, tmp_path):  # noqa: F811
    """timm ``model(x)`` of a CLIP tower (its head: the projection, zero bias) and OpenCLIP ``encode_image``:
    exported with the defaults, ``vitdeploy predict --json`` gives those vectors, on the library's pixels."""
    expect, fmt = TOWERS[case]
    ckpt, ref = _reference(clip_reference, case)
    art, manifest = export(ckpt, photos, tmp_path / "art", export=FP32_ONLY)
    assert manifest["output"] == {"kind": "embedding", "normalize": False} and manifest["labels"] == []
    assert manifest["io"]["output"]["shape"] == ["batch", 24]
    assert manifest["model"]["source"]["format"] == fmt
    vit = manifest["model"]["vit"]
    assert {k: vit.get(k, False) for k in expect} == expect
    with Predictor.from_artifacts(art, backend="ort") as predictor:
        assert_pixels(predictor.preprocess(photo_files(photos)), ref["pixels"], f"{case}: its library's pixels")
    assert_vectors(predict_vectors(art, photos), ref["logits"], case)


def test_an_open_clip_hub_repo_loads_as_its_folder_does(clip_reference, tmp_path, monkeypatch):
    """``hf-hub:org/name`` of an OpenCLIP repo (open_clip_config.json beside open_clip_model.safetensors, no
    config.json): the two files fetched at one commit, the same tower as the folder's."""
    from helpers.fake_hub import FakeHub, folder_files, point_at

    from vitdeploy.model import load_checkpoint

    folder, _ = _reference(clip_reference, "open_clip_quickgelu")
    hub = FakeHub()
    try:
        hub.add("acme/tiny-clip").commit({**folder_files(folder), "README.md": b"# tiny clip"})
        point_at(hub, monkeypatch, tmp_path / "hf")
        from_hub, from_folder = load_checkpoint("hf-hub:acme/tiny-clip"), load_checkpoint(folder)
    finally:
        hub.close()
    assert [f.path for f in from_hub.hub.files] == ["open_clip_config.json", "open_clip_model.safetensors"]
    assert from_hub.source_format == "open_clip" and from_hub.config == from_folder.config
    assert from_hub.preprocess == from_folder.preprocess
    ours, theirs = from_hub.model.state_dict(), from_folder.model.state_dict()
    assert ours.keys() == theirs.keys() and all(bool((ours[k] == theirs[k]).all()) for k in ours)


def test_a_fine_tuned_clip_classifier_keeps_its_head(clip_reference, photos, tmp_path):  # noqa: F811
    """timm's ``vit_*_clip_*`` fine-tuned as a classifier (a head with a real bias, e.g. ``.openai_ft_in1k``): a
    classifier, its logits timm's (only an all-zero bias marks CLIP's projection)."""
    ckpt, ref = _reference(clip_reference, "timm_clip_classifier")
    art, manifest = export(ckpt, photos, tmp_path / "art", export=FP32_ONLY)
    assert manifest["output"]["kind"] == "logits" and len(manifest["labels"]) == 10
    assert manifest["model"]["vit"]["norm_pre"] is True and "proj_dim" not in manifest["model"]["vit"]
    with Predictor.from_artifacts(art, backend="ort") as predictor:
        logits = predictor.predict_logits(predictor.preprocess(photo_files(photos)))
    assert float(np.abs(logits - ref["logits"]).max()) <= VECTOR_TOL


# --------------------------------------------------------------------------- what the tensors and configs say


def _timm_clip_state(head_bias: float) -> dict:
    """A timm-named CLIP tower's state dict (our network: timm's names), its head's bias ``head_bias``."""
    import torch

    from vitdeploy.model import VisionTransformer, ViTConfig

    tiny = ViTConfig(image_size=32, patch_size=8, width=64, depth=1, heads=2, num_classes=12, norm_pre=True)
    state = randomize_(VisionTransformer(tiny), 80).state_dict()
    state["head.bias"] = torch.full((12,), head_bias)
    return state


def test_timm_bare_clip_tower_zero_bias_head_is_the_projection_and_assumptions_are_said(tmp_path):
    import safetensors.torch

    from vitdeploy.model import load_checkpoint

    safetensors.torch.save_file(_timm_clip_state(0.0), str(tmp_path / "tower.safetensors"))
    safetensors.torch.save_file(_timm_clip_state(0.5), str(tmp_path / "classifier.safetensors"))
    tower = load_checkpoint(tmp_path / "tower.safetensors", num_heads=2)
    assert (tower.config.proj_dim, tower.config.num_classes, tower.config.norm_pre) == (12, 0, True)
    assert tower.config.layer_norm_eps == 1e-5 and tower.config.act == "gelu"  # timm's vit_*_clip_*
    assert any("assumed GELU" in n and "model.activation: quick_gelu" in n for n in tower.notes)
    assert tower.preprocess.mean == (0.48145466, 0.4578275, 0.40821073) and tower.preprocess.crop_pct == 1.0
    quick = load_checkpoint(tmp_path / "tower.safetensors", num_heads=2, act="quick_gelu")
    assert quick.config.act == "quick_gelu" and not any("assumed GELU" in n for n in quick.notes)
    classifier = load_checkpoint(tmp_path / "classifier.safetensors", num_heads=2)
    assert (classifier.config.proj_dim, classifier.config.num_classes) == (0, 12)


def test_timm_clip_architectures_of_other_widths_get_timms_heads():
    """``vit_betwixt_patch32_clip_224`` (640 wide) has 10 heads in timm: its config.json names the architecture
    only, and the standard sizes know no such width."""
    import torch

    from vitdeploy.model.formats.timm.convert import timm_vit_config

    state = {
        "patch_embed.proj.weight": torch.zeros(640, 3, 32, 32),
        "cls_token": torch.zeros(1, 1, 640),
        "pos_embed": torch.zeros(1, 50, 640),
        "norm_pre.weight": torch.ones(640),
        "blocks.0.mlp.fc1.weight": torch.zeros(2560, 640),
        "blocks.0.attn.qkv.bias": torch.zeros(1920),
        "proj.weight": torch.zeros(512, 640),
    }
    cfg, origin, _ = timm_vit_config(state, Path("w"), None, {"architecture": "vit_betwixt_patch32_clip_224"})
    assert (cfg.heads, cfg.proj_dim, cfg.layer_norm_eps) == (10, 512, 1e-5)
    assert origin == "checkpoint: config.json architecture vit_betwixt_patch32_clip_224"
    bare, origin, _ = timm_vit_config(state, Path("w"), None, {})  # a bare state dict: assumed, and said
    assert bare.heads == 10 and origin.startswith("library default (assumed): timm's CLIP tower of width 640")


#: open_clip vision_cfg -> the part the one-line refusal names
OPEN_CLIP_REFUSALS = {
    "timm_model_name": ({"timm_model_name": "vit_base_patch16_siglip_224"}, "a timm trunk"),
    "resnet": ({"layers": [3, 4, 6, 3]}, "a ResNet"),
    "coca": ({"attentional_pool": True}, "attention pooling"),
    "custom_block": ({"qk_norm": True}, "qk-norm"),
    "no_pool": ({"pool_type": "none"}, "pool_type 'none'"),
}


@pytest.mark.parametrize("case", list(OPEN_CLIP_REFUSALS))
def test_open_clip_parts_the_network_does_not_have_are_refused_in_one_line(case, tmp_path):
    import safetensors.torch
    import torch

    from vitdeploy.base.errors import CheckpointError
    from vitdeploy.model import load_checkpoint

    vision, part = OPEN_CLIP_REFUSALS[case]
    config = {"model_cfg": {"embed_dim": 8, "vision_cfg": {"width": 64, "patch_size": 8, "image_size": 32, **vision}}}
    (tmp_path / "open_clip_config.json").write_text(json.dumps(config))
    state = {"visual.conv1.weight": torch.zeros(64, 3, 8, 8), "logit_scale": torch.zeros(())}
    safetensors.torch.save_file(state, str(tmp_path / "open_clip_model.safetensors"))
    with pytest.raises(CheckpointError, match="OpenCLIP image tower has") as info:
        load_checkpoint(tmp_path)
    assert part in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- transformers (in-process)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

_VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, patch_size=32)
_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def _hf_tower(kind: str):
    """(model, what transformers returns as the image embedding) of a tiny CLIP of ``kind``."""
    if kind == "with_projection":
        model = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(projection_dim=24, **_VISION))
        return model, lambda x: model(pixel_values=x).image_embeds
    if kind == "vision_model":
        model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(hidden_act="gelu", **_VISION))
        return model, lambda x: model(pixel_values=x).pooler_output
    config = transformers.CLIPConfig(vision_config=_VISION, text_config=_TEXT, projection_dim=24)
    model = transformers.CLIPModel(config)
    return model, lambda x: model.get_image_features(pixel_values=x).pooler_output


#: kind -> (vit fields the manifest must say, the embedding's width)
HF_TOWERS = {
    "with_projection": ({"act": "quick_gelu", "norm_pre": True, "proj_dim": 24, "layer_norm_eps": 1e-5}, 24),
    "vision_model": ({"act": "gelu", "norm_pre": True, "proj_dim": False}, 64),  # pooler_output: no projection
    "clip_model": ({"act": "quick_gelu", "norm_pre": True, "proj_dim": 24}, 24),  # the text tower left out
}


@pytest.mark.parametrize(
    ("kind", "normalize"), [*((kind, False) for kind in HF_TOWERS), ("with_projection", True)], ids=str
)
def test_transformers_clip_towers_predict_their_librarys_vectors(kind, normalize, photos, tmp_path):  # noqa: F811
    """CLIPVisionModelWithProjection (``image_embeds``), CLIPVisionModel (``pooler_output``) and a CLIPModel
    (``get_image_features``), saved with a CLIPImageProcessor: ``vitdeploy predict --json`` gives those vectors
    (L2-normalised with ``model.normalize``), on the processor's pixels."""
    expect, dim = HF_TOWERS[kind]
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model, embed = _hf_tower(kind)
    randomize_(model, 60 + len(kind))
    processor = transformers.CLIPImageProcessorPil(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}
    )
    model.save_pretrained(tmp_path / "ckpt")
    processor.save_pretrained(tmp_path / "ckpt")
    pixels = np.stack(
        [
            processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
            for p in photo_files(photos)
        ]
    )
    with torch.no_grad():
        vectors = embed(torch.from_numpy(pixels)).numpy()
    if normalize:
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    art, manifest = export(
        tmp_path / "ckpt", photos, tmp_path / "art", export=FP32_ONLY, model={"normalize": normalize}
    )
    assert manifest["output"] == {"kind": "embedding", "normalize": normalize}
    assert manifest["io"]["output"]["shape"] == ["batch", dim]
    vit = manifest["model"]["vit"]
    assert {k: vit.get(k, False) for k in expect} == expect
    with Predictor.from_artifacts(art, backend="ort") as predictor:
        assert_pixels(predictor.preprocess(photo_files(photos)), pixels, f"{kind}: CLIPImageProcessor's pixels")
    assert_vectors(predict_vectors(art, photos), vectors, kind)


def test_transformers_clip_tower_without_its_processor_gets_clips_and_says_so(photos, tmp_path):  # noqa: F811
    """No preprocessor_config.json beside a CLIP tower: CLIPImageProcessor's defaults (not ViT's), said."""
    from vitdeploy.model import load_checkpoint
    from vitdeploy.runtime.preprocess import Preprocessor

    model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**{**_VISION, "num_hidden_layers": 1}))
    model.save_pretrained(tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert any("assumed transformers' CLIPImageProcessor defaults" in n for n in loaded.notes)
    processor = transformers.CLIPImageProcessorPil()
    files = photo_files(photos)
    theirs = np.stack(
        [processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0] for p in files]
    )
    assert_pixels(Preprocessor(loaded.preprocess).batch(files), theirs, "CLIPImageProcessor's defaults")


def test_transformers_clip_tower_at_other_sizes_is_interpolate_pos_encoding():
    """export.image_sizes: the tower at 96 px (its table learned at 64) gives what transformers gives with
    ``interpolate_pos_encoding=True`` (bicubic, the class position kept)."""
    import tempfile

    from vitdeploy.model import load_checkpoint

    config = transformers.CLIPVisionConfig(**{**_VISION, "image_size": 64, "patch_size": 16}, projection_dim=24)
    model = randomize_(transformers.CLIPVisionModelWithProjection(config), 90)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = load_checkpoint(folder, image_sizes=(64, 96))
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 96, 96)).astype(np.float32))
    with torch.no_grad():
        theirs = model(pixel_values=pixels, interpolate_pos_encoding=True).image_embeds.numpy()
        ours = loaded.model.forward_features(pixels).numpy()
    assert loaded.config.pos_resample == "bicubic"
    assert_vectors(ours, theirs, "CLIPVisionModelWithProjection at 96 px")


# --------------------------------------------------------------------------- every precision, with its gates


@pytest.mark.slow
def test_a_clip_tower_exports_through_fp16_and_int8_with_their_gates(tmp_path):
    """A tiny CLIPVisionModelWithProjection through FP32, FP16 and INT8 (calibrated on the demo images): every
    graph written and passed by its gate, judged as an embedding (cosine, recall@k; no top-1 agreement)."""
    from vitdeploy.base.config import parse_config
    from vitdeploy.demo import IMAGES_DIR
    from vitdeploy.export.pipeline import run_export

    logging.getLogger("transformers").setLevel(logging.ERROR)
    vision = {**_VISION, "image_size": 64, "patch_size": 16}
    model = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(projection_dim=24, **vision))
    randomize_(model, 70).save_pretrained(tmp_path / "ckpt")
    transformers.CLIPImageProcessorPil(
        size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}
    ).save_pretrained(tmp_path / "ckpt")
    data = {
        "model": {"checkpoint": str(tmp_path / "ckpt"), "normalize": True},
        "validation": {"noise_samples": 2},
        "export": {
            "fp16": {"enabled": True},
            "int8": {"enabled": True, "min_speedup": 0},
            "batch": {"min": 1, "opt": 2, "max": 4},
        },
    }
    out = tmp_path / "art"
    run_export(parse_config(data, None), out, engine="skip", heartbeat_s=None, validation_batch=(1, 4))
    manifest = json.loads((out / "manifest.json").read_text())
    for artifact, path in (("onnx-fp16", "model.fp16.onnx"), ("onnx-int8", "model.int8.onnx")):
        assert manifest["artifacts"][artifact]["path"] == path and (out / path).is_file(), artifact
    for stage in ("validate-onnx", "validate-ort-optimized", "validate-fp16", "validate-int8"):
        record = manifest["validation"][stage]
        assert record["passed"] is True, (stage, record)
        assert "cosine" in record["metrics"] and "recall_at_k" in record["metrics"], stage
        assert "top1_agreement" not in record["metrics"], stage
    images = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))
    with (
        Predictor.from_artifacts(out, backend="ort-int8") as int8,
        Predictor.from_artifacts(out, backend="torch") as eager,
    ):
        pixels = eager.preprocess(images)
        q, ref = int8.embed(pixels), eager.embed(pixels)
    assert q.shape == ref.shape == (len(images), 24)
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-4)
    cosine = (q * ref).sum(axis=1)
    assert float(cosine.min()) >= 0.9 and float(np.abs(q - ref).max()) > 1e-5  # quantized, and close
