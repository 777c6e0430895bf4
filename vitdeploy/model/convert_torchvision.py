"""torchvision ``VisionTransformer`` (vit_b_16 ...) state dicts -> vitdeploy naming.

torchvision's ``nn.MultiheadAttention`` keeps q, k and v stacked in ``in_proj_weight`` in the same
order as our ``qkv``, so the conversion is a renaming. Both MLP namings are accepted: ``mlp.0`` /
``mlp.3`` (torchvision >= 0.13) and ``mlp.linear_1`` / ``mlp.linear_2`` (older releases).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..preprocess_spec import IMAGENET_MEAN, IMAGENET_STD, PreprocessSpec
from .convert_timm import infer_config

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .vit import ViTConfig

_TOP = {
    "conv_proj.weight": "patch_embed.proj.weight",
    "conv_proj.bias": "patch_embed.proj.bias",
    "class_token": "cls_token",
    "encoder.pos_embedding": "pos_embed",
    "encoder.ln.weight": "norm.weight",
    "encoder.ln.bias": "norm.bias",
    "heads.head.weight": "head.weight",
    "heads.head.bias": "head.bias",
}
_LAYER = {
    "ln_1.weight": "norm1.weight", "ln_1.bias": "norm1.bias",
    "self_attention.in_proj_weight": "attn.qkv.weight", "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj.weight": "attn.proj.weight", "self_attention.out_proj.bias": "attn.proj.bias",
    "ln_2.weight": "norm2.weight", "ln_2.bias": "norm2.bias",
    "mlp.0.weight": "mlp.fc1.weight", "mlp.0.bias": "mlp.fc1.bias",
    "mlp.3.weight": "mlp.fc2.weight", "mlp.3.bias": "mlp.fc2.bias",
    "mlp.linear_1.weight": "mlp.fc1.weight", "mlp.linear_1.bias": "mlp.fc1.bias",
    "mlp.linear_2.weight": "mlp.fc2.weight", "mlp.linear_2.bias": "mlp.fc2.bias",
}
_LAYER_RE = re.compile(r"^encoder\.layers\.encoder_layer_(\d+)\.(.+)$")


def looks_like_torchvision(keys: set[str]) -> bool:
    return "conv_proj.weight" in keys and any(k.startswith("encoder.layers.encoder_layer_") for k in keys)


def convert_torchvision_state_dict(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """torchvision -> vitdeploy naming; unknown keys (e.g. ``heads.pre_logits``) pass through unchanged
    so that strict loading reports them."""
    out = {}
    for key, value in state.items():
        if key in _TOP:
            out[_TOP[key]] = value
            continue
        m = _LAYER_RE.match(key)
        if m and m.group(2) in _LAYER:
            out[f"blocks.{m.group(1)}.{_LAYER[m.group(2)]}"] = value
        else:
            out[key] = value
    return out


def torchvision_vit_config(converted: dict[str, "torch.Tensor"], where: Path, variant: str | None) -> "ViTConfig":
    """Architecture from the (already converted) tensors; eps 1e-6 as torchvision uses."""
    keys = {"patch": "patch_embed.proj.weight", "pos": "pos_embed", "fc1": "blocks.0.mlp.fc1.weight",
            "qkv_bias": r"^blocks\.\d+\.attn\.qkv\.bias$", "head": "head.weight"}
    return infer_config(converted, prefix_keys=keys, block_pattern=r"^blocks\.(\d+)\.", where=where,
                        fmt="torchvision", variant=variant)


def torchvision_preprocess(image_size: int) -> PreprocessSpec:
    """What torchvision's ViT weights expect, since the state dict itself does not say.

    At 224 px: the ``IMAGENET1K_V1`` transform (resize the shorter side to 256 bilinear, centre-crop 224,
    ImageNet mean/std) -> timm style, crop_pct 224/256, bilinear. At other sizes (the ``SWAG_E2E_V1``
    weights: 384/512/518): resize to the size with bicubic and no crop (crop_pct 1.0). The
    ``SWAG_LINEAR_V1`` weights (224, bicubic, no crop) cannot be told apart from ``IMAGENET1K_V1`` by
    their tensors; set the preprocessing explicitly for those.
    """
    if image_size == 224:
        return PreprocessSpec(style="timm", height=224, width=224, crop_pct=224 / 256, interpolation="bilinear",
                              mean=IMAGENET_MEAN, std=IMAGENET_STD)
    return PreprocessSpec(style="timm", height=image_size, width=image_size, crop_pct=1.0, interpolation="bicubic",
                          mean=IMAGENET_MEAN, std=IMAGENET_STD)
