"""A ViT with DINOv2 giant's SwiGLU MLP (``mlp: swiglu``) through every export stage the CPU runs: each
artifact written and validated against eager PyTorch, the ORT graph's fusions correct for it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.export.optimize import METADATA_KEY
from vitdeploy.export.pipeline import run_export
from vitdeploy.runtime.artifacts import sha256_file

pytestmark = pytest.mark.integration

GATES = ("validate-onnx", "validate-ort-optimized", "validate-fp16", "validate-int8", "validate-int8-trt")


def _ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


@pytest.mark.slow
def test_tiny_swiglu_vit_exports_every_artifact_validated(tmp_path: Path, export_config):
    import torch

    from vitdeploy.model import VisionTransformer, ViTConfig
    from vitdeploy.model.checkpoints import save_checkpoint

    torch.manual_seed(3)
    cfg = ViTConfig(
        image_size=32, patch_size=8, width=64, depth=2, heads=4, num_classes=7, mlp="swiglu", layer_scale=True
    )
    assert (cfg.mlp_dim, cfg.fc1_dim) == (256, 512)
    model = VisionTransformer(cfg).eval()
    assert tuple(model.blocks[0].mlp.fc1.weight.shape) == (512, 64)
    assert tuple(model.blocks[0].mlp.fc2.weight.shape) == (64, 256)
    save_checkpoint(tmp_path / "ckpt", model, [f"c{i}" for i in range(7)], PreprocessSpec(height=32, width=32), "sw")
    config = export_config(
        {
            "model": {"checkpoint": str(tmp_path / "ckpt")},
            "export": {"batch": {"min": 1, "opt": 2, "max": 4}, "int8": {"min_speedup": 0, "tensorrt": True}},
        }
    )
    result = run_export(config, tmp_path / "out", engine="skip", validation_batch=(1, 4))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["model"]["vit"]["mlp"] == "swiglu"
    assert all(manifest["validation"][g]["passed"] for g in GATES), manifest["validation"]
    roles = {"onnx", "onnx-ort", "onnx-fp16", "onnx-int8", "onnx-int8-trt"}
    assert roles <= set(manifest["artifacts"])
    for entry in manifest["artifacts"].values():
        assert sha256_file(tmp_path / "out" / entry["path"]) == entry["sha256"]

    out = tmp_path / "out"
    assert _ops(out / "model.onnx")["Sigmoid"] == cfg.depth  # SiLU = x * Sigmoid(x), one per block
    ort_ops = _ops(out / "model.ort.onnx")
    # no GELU to fuse: neither BiasGelu nor FastGelu may appear; SiLU stays Sigmoid * x
    assert not {"BiasGelu", "FastGelu", "Gelu"} & set(ort_ops) and ort_ops["Sigmoid"] == cfg.depth
    props = {p.key: p.value for p in onnx.load(str(out / "model.ort.onnx"), load_external_data=False).metadata_props}
    meta = json.loads(props[METADATA_KEY])
    # the SwiGLU Split is over the features: the last block still computes the class token's row only
    assert meta["fused"].get("MultiHeadAttention") == cfg.depth and meta["last_block_class_token_only"] is True
