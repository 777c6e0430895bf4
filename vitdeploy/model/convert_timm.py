"""timm ``vision_transformer`` state dicts: naming, architecture inference, hub config.

timm's parameter names are vitdeploy's own, so the key conversion is the identity; what a bare
state dict does not store (attention heads) is inferred, and the rest read from tensor shapes.
A timm hub directory (``config.json`` with ``architecture`` and ``pretrained_cfg``) also gives the
preprocessing and, when present, ``label_names``.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from ..preprocess_spec import IMAGENET_MEAN, IMAGENET_STD, PreprocessSpec
from ..vocab import INTERPOLATIONS
from .formats import layer_count, resolve_heads

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .vit import ViTConfig

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_INTERPOLATIONS = INTERPOLATIONS


def looks_like_timm(keys: set[str]) -> bool:
    return "patch_embed.proj.weight" in keys and any(k.startswith("blocks.") for k in keys)


def is_timm_config(config: dict[str, Any]) -> bool:
    return "architecture" in config and "model_type" not in config


def convert_timm_state_dict(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """timm -> vitdeploy naming: identical names, so a shallow copy (unknown keys stay, and strict
    loading reports them: layer scale, register tokens, fc_norm ... are not supported)."""
    return dict(state)


def _need(state: dict[str, Any], key: str, where: Path, fmt: str) -> "torch.Tensor":
    if key not in state:
        raise CheckpointError(
            f"{where}: looks like a {fmt} ViT checkpoint but has no {key!r}, needed to infer the "
            "architecture; the file is incomplete or not a standard ViT"
        )
    return state[key]


def infer_config(state: dict[str, "torch.Tensor"], *, prefix_keys: dict[str, str], block_pattern: str,
                 where: Path, fmt: str, variant: str | None, heads: int | None = None) -> "ViTConfig":
    """ViTConfig from tensor shapes. ``prefix_keys`` names where the tensors are (``patch``, ``pos``,
    ``fc1``, ``head``: keys; ``qkv_bias``: a regex, qkv biases exist when any key matches it)."""
    from .vit import ViTConfig

    proj = _need(state, prefix_keys["patch"], where, fmt)
    if proj.ndim != 4 or proj.shape[2] != proj.shape[3]:
        raise CheckpointError(f"{where}: {prefix_keys['patch']} has shape {tuple(proj.shape)}; expected (width, C, p, p)")
    width, channels, patch = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[2])
    depth = layer_count(state, block_pattern)
    if depth == 0:
        raise CheckpointError(f"{where}: looks like a {fmt} ViT checkpoint but holds no transformer blocks")
    pos = _need(state, prefix_keys["pos"], where, fmt)
    tokens = int(pos.shape[-2]) - 1
    grid = math.isqrt(max(tokens, 0))
    if tokens <= 0 or grid * grid != tokens:
        raise CheckpointError(
            f"{where}: {prefix_keys['pos']} has {tokens + 1} tokens, not 1 class token + a square grid; "
            "checkpoints without a class-token position (no_embed_class) or with extra tokens are not supported"
        )
    mlp = int(_need(state, prefix_keys["fc1"], where, fmt).shape[0])
    head = state.get(prefix_keys["head"])
    if heads is None:
        heads = resolve_heads(width, depth, patch, variant, where)
    try:
        cfg = ViTConfig(image_size=grid * patch, patch_size=patch, in_channels=channels, width=width, depth=depth,
                        heads=heads, mlp_ratio=mlp / width,
                        qkv_bias=any(re.match(prefix_keys["qkv_bias"], k) for k in state),
                        layer_norm_eps=1e-6, num_classes=int(head.shape[0]) if head is not None else 0)
    except ValueError as exc:
        raise CheckpointError(f"{where}: inferred an invalid ViT from the tensors: {exc}") from exc
    if cfg.mlp_dim != mlp:
        raise CheckpointError(f"{where}: MLP width {mlp} cannot be represented for width {width}")
    logger.info("%s: inferred %s ViT: %s", where, fmt, cfg)
    return cfg


TIMM_KEYS = {"patch": "patch_embed.proj.weight", "pos": "pos_embed", "fc1": "blocks.0.mlp.fc1.weight",
             "qkv_bias": r"^blocks\.\d+\.attn\.qkv\.bias$", "head": "head.weight"}


def timm_vit_config(state: dict[str, "torch.Tensor"], where: Path, variant: str | None,
                    hub_config: dict[str, Any] | None = None) -> "ViTConfig":
    hub_config = hub_config or {}
    pool = hub_config.get("global_pool", (hub_config.get("model_args") or {}).get("global_pool", "token"))
    if pool not in ("token", None):
        raise CheckpointError(f"{where}: global_pool {pool!r} is not supported; vitdeploy pools the class token")
    heads = (hub_config.get("model_args") or {}).get("num_heads")
    if heads is None and variant is None and hub_config.get("architecture"):
        try:
            return infer_config(state, prefix_keys=TIMM_KEYS, block_pattern=r"^blocks\.(\d+)\.", where=where,
                                fmt="timm", variant=str(hub_config["architecture"]))
        except CheckpointError as exc:
            if "variant" not in str(exc):
                raise
            logger.info("%s: architecture %r not usable as a variant (%s)", where, hub_config["architecture"], exc)
    return infer_config(state, prefix_keys=TIMM_KEYS, block_pattern=r"^blocks\.(\d+)\.", where=where,
                        fmt="timm", variant=variant, heads=heads)


def timm_preprocess(hub_config: dict[str, Any], where: Path) -> PreprocessSpec | None:
    """PreprocessSpec from a timm hub config's ``pretrained_cfg``; None when it has none."""
    pcfg = hub_config.get("pretrained_cfg")
    if not isinstance(pcfg, dict) or "input_size" not in pcfg:
        return None
    if pcfg.get("crop_mode", "center") != "center":
        logger.warning("%s: crop_mode %r cannot be represented; preprocessing left unknown", where, pcfg["crop_mode"])
        return None
    interpolation = pcfg.get("interpolation", "bicubic")
    if interpolation not in _INTERPOLATIONS:
        raise CheckpointError(f"{where}: pretrained_cfg interpolation {interpolation!r} is not one of {_INTERPOLATIONS}")
    size = pcfg["input_size"]
    try:
        return PreprocessSpec(style="timm", height=int(size[-2]), width=int(size[-1]),
                              crop_pct=float(pcfg.get("crop_pct", 0.875)), interpolation=interpolation,
                              mean=tuple(float(v) for v in pcfg.get("mean", IMAGENET_MEAN)),
                              std=tuple(float(v) for v in pcfg.get("std", IMAGENET_STD)))
    except (ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(f"{where}: unusable pretrained_cfg preprocessing: {exc}") from exc


def timm_labels(hub_config: dict[str, Any], num_classes: int, where: Path) -> tuple[str, ...] | None:
    names = hub_config.get("label_names")
    if not names:
        return None
    if len(names) != num_classes:
        raise CheckpointError(f"{where}: label_names has {len(names)} entries but the head has {num_classes} outputs")
    return tuple(str(n) for n in names)
