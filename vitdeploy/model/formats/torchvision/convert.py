"""torchvision ``VisionTransformer`` (vit_b_16 ...) state dicts -> vitdeploy naming.

torchvision's ``nn.MultiheadAttention`` keeps q, k and v stacked in ``in_proj_weight`` in the same
order as our ``qkv``, so the conversion is a renaming. Both MLP namings are accepted: ``mlp.0`` /
``mlp.3`` (torchvision >= 0.13) and ``mlp.linear_1`` / ``mlp.linear_2`` (older releases).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ....base.preprocess_spec import IMAGENET_MEAN, IMAGENET_STD, PreprocessSpec
from ...provenance import LIBRARY, Preprocessing, describe_spec, override_hint
from ..shared import infer_config

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ...vit import ViTConfig

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
    "ln_1.weight": "norm1.weight",
    "ln_1.bias": "norm1.bias",
    "self_attention.in_proj_weight": "attn.qkv.weight",
    "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj.weight": "attn.proj.weight",
    "self_attention.out_proj.bias": "attn.proj.bias",
    "ln_2.weight": "norm2.weight",
    "ln_2.bias": "norm2.bias",
    "mlp.0.weight": "mlp.fc1.weight",
    "mlp.0.bias": "mlp.fc1.bias",
    "mlp.3.weight": "mlp.fc2.weight",
    "mlp.3.bias": "mlp.fc2.bias",
    "mlp.linear_1.weight": "mlp.fc1.weight",
    "mlp.linear_1.bias": "mlp.fc1.bias",
    "mlp.linear_2.weight": "mlp.fc2.weight",
    "mlp.linear_2.bias": "mlp.fc2.bias",
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


def torchvision_vit_config(
    converted: dict[str, "torch.Tensor"],
    where: Path,
    variant: str | None,
    *,
    num_heads: int | None = None,
    act: str | None = None,
    layer_norm_eps: float | None = None,
) -> tuple["ViTConfig", str]:
    """(ViTConfig, heads origin) from the (already converted) tensors; eps 1e-6 and exact GELU as
    torchvision's ViT uses, unless pipeline.yaml says otherwise."""
    keys = {
        "patch": "patch_embed.proj.weight",
        "pos": "pos_embed",
        "fc1": "blocks.0.mlp.fc1.weight",
        "qkv_bias": r"^blocks\.\d+\.attn\.qkv\.bias$",
        "head": "head.weight",
    }
    return infer_config(
        converted,
        prefix_keys=keys,
        block_pattern=r"^blocks\.(\d+)\.",
        where=where,
        fmt="torchvision",
        variant=variant,
        heads=num_heads,
        heads_origin="pipeline.yaml: model.num_heads" if num_heads is not None else "",
        act=act or "gelu",
        layer_norm_eps=1e-6 if layer_norm_eps is None else layer_norm_eps,
    )


# The documented transforms of torchvision's ViT weights (torchvision.models.ViT_*_Weights: every one is
# ImageClassification(crop_size, resize_size, ImageNet mean/std, interpolation)).
# (width, patch) -> (builder, {image size: (weights, resize_size, interpolation)}).
TORCHVISION_WEIGHTS = {
    (768, 16): (
        "vit_b_16",
        {224: ("IMAGENET1K_V1", 256, "bilinear"), 384: ("IMAGENET1K_SWAG_E2E_V1", 384, "bicubic")},
    ),
    (768, 32): ("vit_b_32", {224: ("IMAGENET1K_V1", 256, "bilinear")}),
    (1024, 16): (
        "vit_l_16",
        {224: ("IMAGENET1K_V1", 242, "bilinear"), 512: ("IMAGENET1K_SWAG_E2E_V1", 512, "bicubic")},
    ),
    (1024, 32): ("vit_l_32", {224: ("IMAGENET1K_V1", 256, "bilinear")}),
    (1280, 14): (
        "vit_h_14",
        {224: ("IMAGENET1K_SWAG_LINEAR_V1", 224, "bicubic"), 518: ("IMAGENET1K_SWAG_E2E_V1", 518, "bicubic")},
    ),
}


def torchvision_weights_for(cfg: "ViTConfig") -> tuple[str, int, str, bool]:
    """(weights name, resize_size, interpolation, whether torchvision ships weights of this shape) of the
    torchvision weights a checkpoint is taken for.

    Matched on width, patch and image size. Other shapes get the convention of ``ViT_B_16_Weights``:
    ``IMAGENET1K_V1`` at 224 (resize 256, bilinear), ``SWAG_E2E_V1`` style elsewhere (resize to the
    crop size, bicubic). The ``SWAG_LINEAR_V1`` weights (224, resize 224, bicubic) have the same
    tensors as ``IMAGENET1K_V1`` and cannot be told apart: set the preprocessing for those.
    """
    builder, by_size = TORCHVISION_WEIGHTS.get((cfg.width, cfg.patch_size), ("vit_b_16", {}))
    if cfg.image_size in by_size:
        weights, resize, interp = by_size[cfg.image_size]
        return f"{builder.upper().replace('VIT', 'ViT')}_Weights.{weights}", resize, interp, True
    if cfg.image_size == 224:
        return "ViT_B_16_Weights.IMAGENET1K_V1", 256, "bilinear", False
    return "ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1", cfg.image_size, "bicubic", False


def torchvision_preprocess(cfg: "ViTConfig", where: Path) -> Preprocessing:
    """What torchvision's ViT weights expect, since the state dict itself does not say (an assumption,
    noted so the user sees it)."""
    weights, resize, interp, shipped = torchvision_weights_for(cfg)
    size = cfg.image_size
    spec = PreprocessSpec(
        style="torchvision",
        height=size,
        width=size,
        shortest_edge=resize,
        interpolation=interp,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )
    which = (
        f"the documented transforms of torchvision's {weights}"
        if shipped
        else f"the convention of torchvision's {weights} (torchvision ships no ViT weights of this shape)"
    )
    note = (
        f"{where.name}: no preprocessing in the checkpoint; assumed {which} ({describe_spec(spec)}); {override_hint()}"
    )
    return Preprocessing.from_source(spec, f"{LIBRARY}: torchvision {weights}.transforms()", notes=(note,))
