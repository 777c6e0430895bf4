"""An embedding export with its patch tokens (``model.patch_tokens``): every CPU stage (model.onnx, the ORT
graph, FP16, INT8) carries PATCH_TOKENS [batch, P, D] beside EMBEDDINGS, each validation judges them (cosine per
token: the lowest and the 1st percentile, gated by ``min_patch_cosine``), the read-back refuses a manifest that
disagrees with the graphs, and `predict --json` gives them only with ``--patch-tokens``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError, ExportError
from vitdeploy.cli import main
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.export.compare import compare
from vitdeploy.export.manifest import read_back
from vitdeploy.export.pipeline import run_export

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

pytestmark = pytest.mark.integration

# 2 registers: the patch tokens start after the class token and the registers
TINY = dict(image_size=32, patch_size=8, width=32, depth=2, heads=2, reg_tokens=2)
PATCHES = (16, 32)
IMAGES = sorted(IMAGES_DIR.glob("*.png"))[:3]


def _checkpoint(folder: Path, classes: int) -> Path:
    from vitdeploy.model.checkpoints import save_checkpoint
    from vitdeploy.model.vit import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**TINY, num_classes=classes)).eval()
    return save_checkpoint(folder, model, [f"c{i}" for i in range(classes)], None, "tiny")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The tiny headless ViT exported with patch tokens through every CPU stage (INT8 shipped whatever its speed)."""
    ckpt = _checkpoint(tmp_path_factory.mktemp("ckpt"), 0)
    export = {"batch": {"min": 1, "opt": 2, "max": 4}, "int8": {"enabled": True, "min_speedup": 0}}
    cfg = parse_config({"model": {"checkpoint": str(ckpt), "patch_tokens": True}, "export": export}, None)
    out = tmp_path_factory.mktemp("patch_export")
    run_export(cfg, out, engine="skip")
    return out


def test_every_graph_returns_the_patch_tokens_and_every_validation_judges_them(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["output"] == {"kind": "embedding", "normalize": False, "patch_tokens": True}
    assert manifest["io"]["patch_tokens"] == {"name": "PATCH_TOKENS", "dtype": "float32", "shape": ["batch", *PATCHES]}
    graphs = {role: e["path"] for role, e in manifest["artifacts"].items() if e["path"].endswith(".onnx")}
    assert set(graphs) == {"onnx", "onnx-ort", "onnx-fp16", "onnx-int8"}
    for role, path in graphs.items():
        outputs = onnx.load(str(exported / path), load_external_data=False).graph.output
        dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in outputs}
        assert dims == {"EMBEDDINGS": ["batch", 32], "PATCH_TOKENS": ["batch", *PATCHES]}, role
    stages = ("validate-onnx", "validate-ort-optimized", "validate-fp16", "validate-int8")
    for stage in stages:
        result = manifest["validation"][stage]
        assert result["passed"] and result["thresholds"]["min_patch_cosine"] == result["thresholds"]["min_cosine"]
        for per_batch in result["per_batch"].values():  # every batch size judged them, not the largest alone
            assert per_batch["metrics"]["patch_cosine"] >= result["thresholds"]["min_patch_cosine"], stage
            assert per_batch["metrics"]["patch_cosine_p01"] >= per_batch["metrics"]["patch_cosine"], stage
        assert len(result["per_image"]["patch_cosine"]) == len(result["per_image"]["cosine"])
    assert manifest["validation"]["validate-onnx"]["metrics"]["patch_cosine"] > 0.99999


def _tampered(exported: Path, tmp_path: Path, change, files: tuple[str, ...] = ("manifest.json",)) -> Path:
    """A copy of the export with ``change`` applied to each JSON file of ``files``."""
    folder = tmp_path / "copy"
    shutil.copytree(exported, folder)
    for name in files:
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / name).write_text(json.dumps(data))
    return folder


def test_read_back_refuses_a_manifest_that_disagrees_with_the_graphs(exported, tmp_path):
    read_back(exported)  # as written: accepted

    def wider(manifest):
        manifest["io"]["patch_tokens"]["shape"] = ["batch", 17, 32]

    with pytest.raises(ExportError, match=r"patch tokens \[16, 32\] vs \[17, 32\] in io.patch_tokens"):
        read_back(_tampered(exported, tmp_path / "a", wider))

    def forgotten(data):  # the graphs return PATCH_TOKENS, the manifest (and model.json) say nothing of them
        data.get("io", {}).pop("patch_tokens", None)
        del data["output"]["patch_tokens"]

    with pytest.raises(ExportError, match=r"outputs \['PATCH_TOKENS'\] are not in the manifest's io"):
        read_back(_tampered(exported, tmp_path / "b", forgotten, ("manifest.json", "model.json")))

    def unnamed(manifest):  # output.patch_tokens without io.patch_tokens
        del manifest["io"]["patch_tokens"]

    with pytest.raises(ExportError, match="output.patch_tokens is true but io.patch_tokens is absent"):
        read_back(_tampered(exported, tmp_path / "c", unnamed))


def test_predict_json_gives_patch_tokens_only_when_asked(exported, tiny_artifacts):
    args = ["predict", *map(str, IMAGES[:2]), "-a", str(exported), "-b", "ort", "--json"]
    plain = CliRunner().invoke(main, args, catch_exceptions=False)
    assert plain.exit_code == 0, plain.output
    assert [set(json.loads(line)) for line in plain.stdout.splitlines()] == [{"path", "embedding"}] * 2
    asked = CliRunner().invoke(main, [*args, "--patch-tokens"], catch_exceptions=False)
    assert asked.exit_code == 0, asked.output
    records = [json.loads(line) for line in asked.stdout.splitlines()]
    tokens = np.array([r["patch_tokens"] for r in records], dtype=np.float32)
    assert tokens.shape == (2, *PATCHES)
    from vitdeploy.runtime.predictor import Predictor

    with Predictor.from_artifacts(exported, backend="torch") as predictor:  # eager: the library's network
        _, eager = predictor.embed([str(p) for p in IMAGES[:2]], patch_tokens=True)
    np.testing.assert_allclose(tokens, eager, atol=1e-4, rtol=0)
    refused = CliRunner().invoke(main, ["predict", str(IMAGES[0]), "-a", str(tiny_artifacts()), "--patch-tokens"])
    assert refused.exit_code == 2 and "exported without patch tokens" in refused.output, refused.output


def test_patch_tokens_on_a_classifier_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="model.patch_tokens applies to embeddings"):
        parse_config({"model": {"output": "logits", "patch_tokens": True}}, None)
    ckpt = _checkpoint(tmp_path / "head", 3)  # output auto: a classifier, its head's logits
    cfg = parse_config({"model": {"checkpoint": str(ckpt), "patch_tokens": True}}, None)
    with pytest.raises(ConfigError, match=r"model.patch_tokens applies to embeddings, but .* exports logits"):
        run_export(cfg, tmp_path / "out", engine="skip")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_patch_tokens_are_gated_by_min_patch_cosine():
    """One token turned away from eager's fails the gate although the vectors and their neighbours agree."""
    rng = np.random.default_rng(0)
    vectors, tokens = rng.normal(size=(6, 8)), rng.normal(size=(6, 4, 8))
    moved = tokens.copy()
    moved[2, 1] = -moved[2, 1]
    tolerance = {"max_abs_diff": 1e-3, "mean_abs_diff": 1e-4, "min_cosine": 0.999, "min_patch_cosine": 0.999}
    good = compare(vectors, vectors, tolerance, "embedding", (tokens, tokens))
    assert good.passed and good.metrics["patch_cosine"] == pytest.approx(1.0)
    bad = compare(vectors, vectors, tolerance, "embedding", (tokens, moved))
    assert bad.metrics["patch_cosine"] == pytest.approx(-1.0) and bad.metrics["cosine"] == pytest.approx(1.0)
    assert bad.failures == ("patch_cosine: expected >= 0.999, got -1",)
