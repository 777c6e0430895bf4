"""A SigLIP image tower (no class token, ``pool: map``: a learned probe attending over the patch tokens, then its
norm and MLP) through every export stage the CPU runs: each graph written and judged as an embedding is (cosine and
recall@k against eager PyTorch, never flips; INT8 for ONNX Runtime and as placed for TensorRT), the ORT graph's
fusions correct for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.library_reference import randomize_

from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.export.optimize import METADATA_KEY
from vitdeploy.export.pipeline import run_export
from vitdeploy.runtime.predictor import Predictor

pytestmark = pytest.mark.integration

GATES = ("validate-onnx", "validate-ort-optimized", "validate-fp16", "validate-int8", "validate-int8-trt")


@pytest.mark.slow
def test_tiny_siglip_tower_exports_fp32_fp16_int8_each_gated_as_an_embedding(tmp_path: Path, export_config):
    from vitdeploy.demo import IMAGES_DIR
    from vitdeploy.model import VisionTransformer, ViTConfig
    from vitdeploy.model.checkpoints import save_checkpoint

    cfg = ViTConfig(
        image_size=32, patch_size=8, width=64, depth=2, heads=4, num_classes=0, class_token=False, pool="map"
    )
    model = randomize_(VisionTransformer(cfg), 5)
    assert model.cls_token is None and tuple(model.attn_pool.kv.weight.shape) == (128, 64)
    spec = PreprocessSpec(height=32, width=32, interpolation="bicubic")
    save_checkpoint(tmp_path / "ckpt", model, [], spec, "siglip-tiny")
    config = export_config(
        {
            "model": {"checkpoint": str(tmp_path / "ckpt")},
            "validation": {"images": str(IMAGES_DIR), "noise_samples": 2},
            "export": {"batch": {"min": 1, "opt": 2, "max": 4}, "int8": {"min_speedup": 0, "tensorrt": True}},
        }
    )
    result = run_export(config, tmp_path / "out", engine="skip", validation_batch=(1, 4))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["output"]["kind"] == "embedding" and manifest["model"]["vit"]["pool"] == "map"
    assert {"onnx", "onnx-ort", "onnx-fp16", "onnx-int8", "onnx-int8-trt"} <= set(manifest["artifacts"])
    for gate in GATES:
        verdict = manifest["validation"][gate]
        assert verdict["passed"] and verdict["kind"] == "embedding", (gate, verdict)
        assert {"cosine", "recall_at_k"} <= set(verdict["metrics"]) and "top1_agreement" not in verdict["metrics"]
    fp32 = manifest["validation"]["validate-ort-optimized"]["metrics"]
    assert fp32["cosine"] >= 0.99999 and fp32["recall_at_k"] == 1.0

    out = tmp_path / "out"
    props = {p.key: p.value for p in onnx.load(str(out / "model.ort.onnx"), load_external_data=False).metadata_props}
    meta = json.loads(props[METADATA_KEY])
    # the blocks' attention fused; the pool's (one query, separate q and kv) left as written; no class token to
    # prune the last block to: every token feeds the pool
    assert meta["fused"].get("MultiHeadAttention") == cfg.depth and meta["last_block_class_token_only"] is False

    import torch

    images = sorted(IMAGES_DIR.glob("*.png"))[:4]
    with Predictor.from_artifacts(out, backend="ort") as predictor:
        pixels = predictor.preprocess(images)
        vectors = predictor.embed(pixels)
    with torch.no_grad():
        eager = model(torch.from_numpy(pixels)).numpy()
    assert float(np.abs(vectors - eager).max()) <= 1e-4
