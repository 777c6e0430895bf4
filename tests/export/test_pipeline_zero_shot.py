"""A zero-shot classifier compiled into one image-only graph (`vitdeploy export CHECKPOINT --labels FILE`), against
the library's own zero-shot prediction: a random-weight CLIPModel and SiglipModel (tiny, the real structure;
tests/helpers/tiny_contrastive.py; sharpened so the top-1 is no tie), exported with their class names, answer
`vitdeploy predict --json` on the demo photos with transformers' zero-shot-image-classification pipeline's top-1
and its probabilities within 1e-3 (CLIP's softmax, SigLIP's sigmoid) on every FP32 backend; the FP16 and INT8
graphs pass their gates; the export holds no text weight, no tokenizer, and records what it baked.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.base.vocab import POOLS
from vitdeploy.base.zero_shot_spec import DEFAULT_TEMPLATES
from vitdeploy.cli import main
from vitdeploy.demo import IMAGES_DIR

transformers = pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LABELS = ("zero", "one", "two", "three", "four")
TEMPLATE = "a photo of a {}."
PHOTOS = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))[:8]
FAMILIES = {
    "clip": "softmax",
    # SigLIP's image tower (attention pooling, pool 'map') comes with branch h-siglip
    "siglip": "sigmoid",
}


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _needs_tower(family: str) -> None:
    if family == "siglip" and "map" not in POOLS:
        pytest.skip("SigLIP's image tower (pool 'map') is not in this tree")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """family -> (checkpoint folder, export folder), each exported once, on first use."""
    root = tmp_path_factory.mktemp("zero_shot")
    (root / "labels.txt").write_text("\n".join(LABELS) + "\n", encoding="utf-8")
    (root / "pipeline.yaml").write_text(
        "export:\n  batch: {min: 1, opt: 2, max: 8}\n  int8: {enabled: true, min_speedup: 0}\n", encoding="utf-8"
    )
    made: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in made:
            from helpers import tiny_contrastive

            ckpt = getattr(tiny_contrastive, f"save_tiny_{family}")(root / f"{family}-ckpt")
            out = root / f"{family}-export"
            res = run(
                "export", str(ckpt), "-c", str(root / "pipeline.yaml"), "--labels", str(root / "labels.txt"),
                "--template", TEMPLATE, "-o", str(out), "--engine", "skip",
            )  # fmt: skip
            assert res.exit_code == 0, res.output
            made[family] = ckpt, out
        return made[family]

    return get


def _pipeline_scores(ckpt: Path) -> np.ndarray:
    """transformers' zero-shot pipeline on each photo with the same prompt: (photos, classes) in LABELS' order."""
    from PIL import Image

    pipe = transformers.pipeline("zero-shot-image-classification", model=str(ckpt))
    rows = []
    for photo in PHOTOS:
        answer = pipe(Image.open(photo).convert("RGB"), candidate_labels=list(LABELS), hypothesis_template=TEMPLATE)
        scores = {a["label"]: a["score"] for a in answer}
        rows.append([scores[name] for name in LABELS])
    return np.asarray(rows)


def _predicted(export: Path, backend: str) -> np.ndarray:
    res = run("predict", *map(str, PHOTOS), "-a", str(export), "-b", backend, "--json", "-k", str(len(LABELS)))
    assert res.exit_code == 0, res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    assert [Path(r["path"]).name for r in records] == [p.name for p in PHOTOS]
    return np.asarray([[{t["label"]: t["score"] for t in r["top_k"]}[name] for name in LABELS] for r in records])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_predict_answers_the_librarys_zero_shot_prediction(exports, family):
    _needs_tower(family)
    ckpt, export = exports(family)
    reference = _pipeline_scores(ckpt)
    top2 = np.sort(reference, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > 0.01).all(), "sharpened: each photo has a clear top-1"
    if FAMILIES[family] == "softmax":
        np.testing.assert_allclose(reference.sum(axis=1), 1.0, atol=1e-6)
    else:  # SigLIP's classes are scored each on its own
        assert np.abs(reference.sum(axis=1) - 1.0).max() > 0.05
    for backend in ("torch", "ort"):
        ours = _predicted(export, backend)
        assert (ours.argmax(axis=1) == reference.argmax(axis=1)).all(), backend
        np.testing.assert_allclose(ours, reference, atol=1e-3, err_msg=backend)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_export_is_a_classifier_without_its_text_tower(exports, family):
    """Labels, the score function, the gates of every precision (flips), and no text weight or tokenizer shipped;
    the manifest says what was baked, from which model, with which tokenizer."""
    _needs_tower(family)
    _, export = exports(family)
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["labels"] == list(LABELS)
    assert manifest["output"]["kind"] == "logits"
    assert manifest["output"].get("scores", "softmax") == FAMILIES[family]
    for gate in ("validate-onnx", "validate-ort-optimized", "validate-fp16", "validate-int8"):
        assert manifest["validation"][gate]["passed"], gate
        assert "flips" in manifest["validation"][gate], gate
    record = manifest["zero_shot"]
    assert record["labels"] == list(LABELS) and record["templates"] == [TEMPLATE]
    assert record["scores"] == FAMILIES[family]
    assert (record["logit_bias"] is not None) == (family == "siglip")
    assert record["text_model"]["class"] == {"clip": "CLIPModel", "siglip": "SiglipModel"}[family]
    assert record["text_model"]["method"] == "get_text_features"
    from safetensors import safe_open

    with safe_open(str(export / "model.safetensors"), "np") as weights:
        keys = list(weights.keys())
        assert weights.get_tensor("head.weight").shape == (len(LABELS), record["embedding_width"])
    assert not [k for k in keys if "text" in k or "token_embedding" in k], "no text weight ships"
    assert not list(export.glob("tokenizer*")) and not list(export.glob("vocab*"))
    graph = onnx.load(str(export / "model.onnx"), load_external_data=False)
    assert [i.name for i in graph.graph.input] == ["pixel_values"]  # images in, nothing else
    assert [o.name for o in graph.graph.output] == ["logits"]


def test_the_triton_repository_scores_as_the_export_does(exports, tmp_path):
    """The generated Triton postprocess model is told the export's score function (SigLIP: sigmoid)."""
    family = "siglip" if "map" in POOLS else "clip"
    _, export = exports(family)
    res = run("triton-repo", "-a", str(export), "-o", str(tmp_path / "repo"))
    assert res.exit_code == 0, res.output
    (config,) = (tmp_path / "repo").glob("*_postprocess/config.pbtxt")
    text = config.read_text()
    assert f'parameters {{ key: "scores" value: {{ string_value: "{FAMILIES[family]}" }} }}' in text


def test_a_hub_checkpoint_brings_its_tokenizer_from_the_same_commit(exports, tmp_path, monkeypatch):
    """`export acme/tiny-clip --labels`: the tokenizer's files fetched at the weights' commit (a Hub on loopback,
    tests/helpers/fake_hub.py), hashed into model.source.hub, and the text model's provenance pinned to it; the
    default templates."""
    from helpers.fake_hub import FakeHub, folder_files, point_at

    ckpt, _ = exports("clip")
    hub = FakeHub()
    try:
        commit = hub.add("acme/tiny-clip").commit(folder_files(ckpt))
        point_at(hub, monkeypatch, tmp_path / "hf")
        (tmp_path / "labels.txt").write_text("\n".join(LABELS) + "\n", encoding="utf-8")
        fast = tmp_path / "fast.yaml"
        fast.write_text("export: {fp16: {enabled: false}, int8: {enabled: false}, batch: {min: 1, opt: 1, max: 2}}\n")
        out = tmp_path / "out"
        res = run(
            "export", "acme/tiny-clip", "--labels", str(tmp_path / "labels.txt"), "-c", str(fast),
            "-o", str(out), "--engine", "skip",
        )  # fmt: skip
        assert res.exit_code == 0, res.output
    finally:
        hub.close()
    manifest = json.loads((out / "manifest.json").read_text())
    fetched = {f["path"] for f in manifest["model"]["source"]["hub"]["files"]}
    assert {"tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= fetched
    assert manifest["zero_shot"]["text_model"]["checkpoint"] == f"acme/tiny-clip@{commit}"
    assert manifest["zero_shot"]["templates"] == list(DEFAULT_TEMPLATES)
    assert manifest["labels"] == list(LABELS)
