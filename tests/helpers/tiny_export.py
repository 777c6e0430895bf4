"""A complete tiny export directory, written the way `vitdeploy export` lays one out.

``build_tiny_artifacts``: a tiny ViT (safetensors + model.json), ONNX opset 18 with a dynamic
"batch" axis, manifest.json with sha256s. Tests get one through the ``tiny_artifacts`` fixture
(tests/conftest.py); ``write_manifest`` / ``file_entry`` build hand-made manifests.
``save_headless_dinov2``: a tiny transformers backbone without a head (an embedding model once exported,
behind the ``embedding_artifacts`` fixture).
``fused_tiny_vit``: a tiny ViT's ONNX Runtime graph with its attention fused (model.ort.onnx's
MultiHeadAttention), what INT8 writes attention out of.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from vitdeploy.runtime.artifacts import sha256_file

LABELS = ["apple", "banana", "cherry", "date", "elder"]
TINY = dict(image_size=32, patch_size=8, width=32, depth=2, heads=2, num_classes=len(LABELS))
PREPROCESS = {
    "style": "hf",
    "height": 32,
    "width": 32,
    "crop_pct": 0.875,
    "interpolation": "bilinear",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
    "background": [255, 255, 255],
}


def file_entry(directory: Path, name: str) -> dict:
    path = directory / name
    return {"path": name, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(
    directory: Path,
    artifacts: dict,
    *,
    image_size: int = 32,
    num_classes: int = 5,
    labels: list[str] | None = None,
    batch: dict | None = None,
    **extra,
) -> Path:
    manifest = {
        "format": "vitdeploy-manifest",
        "version": 1,
        "name": "tiny",
        "created": "2025-01-01T00:00:00+00:00",
        "model": {"vit": {**TINY, "image_size": image_size}, "source": {"path": "tiny", "format": "vitdeploy"}},
        "labels": labels if labels is not None else LABELS[:num_classes],
        "preprocess": {**PREPROCESS, "height": image_size, "width": image_size},
        "io": {
            "input": {"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, image_size, image_size]},
            "output": {"name": "logits", "dtype": "float32", "shape": ["batch", num_classes]},
        },
        "batch": batch or {"min": 1, "opt": 2, "max": 4},
        "artifacts": artifacts,
        "versions": {},
        "validation": {},
        "stages": [],
    }
    manifest.update(extra)
    path = directory / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2))
    return path


def build_tiny_artifacts(out: Path, *, seed: int = 0, fp16_copy: bool = True) -> Path:
    """A tiny-ViT export directory. ``fp16_copy``: register model.onnx's bytes as the "onnx-fp16"
    role too (a wiring stand-in; real FP16 conversion belongs to export)."""
    import torch
    from safetensors.torch import save_file

    from vitdeploy.model.vit import VisionTransformer, ViTConfig

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = ViTConfig(**TINY)
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():  # larger weights than the 0.02 init so logits are O(1) and differ per image
        for name, p in model.named_parameters():
            if p.dim() > 1 or (name.endswith("bias") and "norm" not in name):
                p.normal_(0.0, 0.2)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    (out / "model.json").write_text(
        json.dumps(
            {
                "format": "vitdeploy",
                "version": 1,
                "name": "tiny",
                "vit": cfg.to_dict(),
                "labels": LABELS,
                "preprocess": PREPROCESS,
            }
        )
    )
    x = torch.randn(2, 3, cfg.image_size, cfg.image_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                model,
                (x,),
                str(out / "model.onnx"),
                input_names=["pixel_values"],
                output_names=["logits"],
                opset_version=18,
                dynamo=False,
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
            )
        except Exception:  # noqa: BLE001 - a torch without the legacy exporter: use torch.export
            batch = torch.export.Dim("batch", min=1, max=64)
            torch.onnx.export(
                model,
                (x,),
                str(out / "model.onnx"),
                input_names=["pixel_values"],
                output_names=["logits"],
                opset_version=18,
                dynamo=True,
                external_data=False,
                dynamic_shapes={"pixel_values": {0: batch}},
            )
    roles = {
        "weights": file_entry(out, "model.safetensors"),
        "weights-config": file_entry(out, "model.json"),
        "onnx": file_entry(out, "model.onnx"),
    }
    if fp16_copy:
        shutil.copyfile(out / "model.onnx", out / "model.fp16.onnx")
        roles["onnx-fp16"] = file_entry(out, "model.fp16.onnx")
    write_manifest(out, roles)
    return out


def save_headless_dinov2(out: Path) -> Path:
    """A tiny transformers ``Dinov2WithRegistersModel`` (width 64, 2 blocks, 2 heads, 56 px, patch 14, 4
    registers; random weights, seed 0) saved with ``save_pretrained``, with a ``BitImageProcessor`` config:
    a headless checkpoint, so `vitdeploy export` makes an embedding model of it (``model.output: auto``)."""
    import torch
    from transformers import BitImageProcessor, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    torch.manual_seed(0)
    cfg = Dinov2WithRegistersConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
        num_register_tokens=4,
        mlp_ratio=4,
    )
    Dinov2WithRegistersModel(cfg).eval().save_pretrained(out)
    BitImageProcessor(
        size={"shortest_edge": 64},
        crop_size={"height": 56, "width": 56},
        do_center_crop=True,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(out)
    return out


#: ``fused_tiny_vit``'s network: heads of 32 (the attention rewrite's rule wants >= 32), 17 tokens
FUSED = dict(image_size=32, patch_size=8, width=64, depth=2, heads=2, num_classes=7)


def fused_tiny_vit(out: Path, key_shift: float = 0.0) -> Path:
    """A tiny random ViT (:data:`FUSED`, seed 0, weights and biases N(0, 0.2)) exported by vitdeploy and fused
    for ONNX Runtime into ``out``/model.ort.onnx (MultiHeadAttention, class-token-only last block), returned;
    ``key_shift`` added to every key (the key part of each block's qkv bias)."""
    import torch

    from vitdeploy.export.onnx import export_onnx
    from vitdeploy.export.optimize import optimize_for_ort
    from vitdeploy.model import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    cfg = ViTConfig(**FUSED)
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # non-zero biases: a rewrite that drops or swaps one would show
        for block in model.blocks:
            block.attn.qkv.bias[cfg.width : 2 * cfg.width] += key_shift
    export_onnx(model, out / "model.onnx", image_size=cfg.image_size)
    return optimize_for_ort(out / "model.onnx", out / "model.ort.onnx", num_heads=cfg.heads, hidden_size=cfg.width)
