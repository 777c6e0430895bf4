"""The INT8 stage covers the ViT relatives (issue 15): average pooling with fc_norm, register tokens (no prefix
positions, layer scale), DeiT's distillation token (two heads averaged) and transformers' DINOv2 with
registers (class token + mean patch token head). Each tiny model is exported with
``export.int8.enabled: true`` (required: a failure fails the export) and calibrated on the demo images.

What a user relies on: ``model.int8.onnx`` is written and listed, really holds INT8 MatMul/Gemm nodes,
opens as the ``ort-int8`` backend, passes ``validation.int8`` (its drift gate), and gives the eager FP32
model's (the ``torch`` backend's) top-1 class on the validation images.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.library_reference import randomize_

from vitdeploy.base.config import parse_config
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.export.pipeline import run_export
from vitdeploy.runtime.predictor import Predictor

pytestmark = pytest.mark.integration

TINY = dict(image_size=32, patch_size=8, width=64, depth=2, heads=4, num_classes=10)


def _ours(folder: Path, **family) -> Path:
    """Our ViT with ``family`` fields, random weights (as the library-written ones), vitdeploy format."""
    import torch

    from vitdeploy.base.preprocess_spec import PreprocessSpec
    from vitdeploy.model import VisionTransformer, ViTConfig, save_checkpoint

    torch.manual_seed(5)
    model = randomize_(VisionTransformer(ViTConfig(**TINY, **family)), 5)
    return save_checkpoint(folder, model, [f"c{i}" for i in range(10)], PreprocessSpec(height=32, width=32), "tiny")


def _transformers(folder: Path, kind: str) -> Path:
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    transformers.logging.set_verbosity_error()
    if kind == "deit_distilled":
        config = transformers.DeiTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=256,
            num_labels=10,
        )
        model = transformers.DeiTForImageClassificationWithTeacher(config)
        processor = transformers.DeiTImageProcessorPil(
            size={"height": 36, "width": 36}, crop_size={"height": 32, "width": 32}
        )
    else:
        config = transformers.Dinov2WithRegistersConfig(
            image_size=42,
            patch_size=14,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_labels=10,
            num_register_tokens=4,
        )
        model = transformers.Dinov2WithRegistersForImageClassification(config)
        processor = transformers.BitImageProcessorPil(
            size={"shortest_edge": 48}, crop_size={"height": 42, "width": 42}
        )
    randomize_(model, 6).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


SHAPES = {
    "avg_fc_norm": (lambda d: _ours(d, pool="avg", fc_norm=True), {"pool": "avg", "fc_norm": True}),
    "registers": (
        lambda d: _ours(d, reg_tokens=4, pos_embed_prefix=False, layer_scale=True),
        {"reg_tokens": 4, "pos_embed_prefix": False},
    ),
    "deit_distilled": (lambda d: _transformers(d, "deit_distilled"), {"distilled": True}),
    "dinov2_registers": (lambda d: _transformers(d, "dinov2_registers"), {"pool": "token_avg", "reg_tokens": 4}),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_required_export_of_each_relative(shape, tmp_path):
    make, expect = SHAPES[shape]
    ckpt = make(tmp_path / "ckpt")
    out = tmp_path / "art"
    cfg = parse_config(
        {
            "model": {"checkpoint": str(ckpt)},
            "validation": {"noise_samples": 2},
            "export": {
                "fp16": {"enabled": False},
                "int8": {"enabled": True, "min_speedup": 0},
                "batch": {"min": 1, "opt": 2, "max": 4},
            },
        },
        None,
    )
    run_export(cfg, out, engine="skip", heartbeat_s=None, validation_batch=(1, 4))
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k: manifest["model"]["vit"][k] for k in expect} == expect
    assert manifest["artifacts"]["onnx-int8"]["path"] == "model.int8.onnx" and (out / "model.int8.onnx").is_file()
    record = manifest["export"]["int8"]
    assert record["passed"] is True and record["mode"] == "static" and record["quantized_nodes"] > 0
    # every block's MatMuls stay INT8: the fully quantized graph ships, or the Gemm heads back to float (the
    # autopilot's search after the largest step the speed allows passed)
    steps = [s["step"] for s in record["autopilot"]]
    assert steps[0] == "all MatMul/Gemm quantized" and (len(steps) == 1 or steps[-1] == "op type Gemm float"), steps
    assert record["autopilot"][-1]["passed"]
    assert manifest["validation"]["validate-int8"]["passed"] is True  # the drift gate, validation.int8

    images = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))
    with (
        Predictor.from_artifacts(out, backend="ort-int8") as int8,
        Predictor.from_artifacts(out, backend="torch") as eager,
    ):
        assert int8.backend.name == "ort-int8" and Path(int8.backend.onnx_path).name == "model.int8.onnx"
        pixels = eager.preprocess(images)
        q, ref = int8.predict_logits(pixels), eager.predict_logits(pixels)
    assert q.shape == ref.shape == (len(images), 10)
    agreement = float((q.argmax(1) == ref.argmax(1)).mean())
    assert agreement >= cfg.validation.int8.min_top1_agreement, (shape, agreement)
    assert np.abs(q - ref).max() > 1e-5  # a quantized graph, not the FP32 one under another name
