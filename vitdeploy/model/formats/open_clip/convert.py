"""OpenCLIP's ``VisionTransformer`` (``open_clip.transformer``) -> vitdeploy naming, config and preprocessing,
read without the open_clip package (it is the tests' reference only).

The image tower of an OpenCLIP ``CLIP`` / ``CustomTextCLIP`` state dict is every ``visual.`` key (the text tower,
``logit_scale`` and ``logit_bias`` are left out); a state dict of the tower alone (``model.visual.state_dict()``)
loads too. Its ViT is ours with CLIP's parts: ``conv1`` (no bias) -> ``patch_embed.proj``, ``class_embedding``
(width,) -> ``cls_token``, ``positional_embedding`` (positions, width) -> ``pos_embed``, ``ln_pre`` -> ``norm_pre``
(``no_ln_pre``: none, and the convolution gets a zero bias, the same sum), per block ``ln_1`` / ``ln_2`` ->
``norm1`` / ``norm2``, ``attn.in_proj_*`` -> ``attn.qkv``, ``attn.out_proj`` -> ``attn.proj``, ``mlp.c_fc`` /
``mlp.c_proj`` -> ``mlp.fc1`` / ``fc2``, layer scale ``ls_1`` / ``ls_2`` -> ``ls1`` / ``ls2``; ``ln_post`` is the
final norm on every token (``norm``), or after the average pooling (``fc_norm``: ``final_ln_after_pool`` with
``pool_type: avg``); ``proj`` (width, embed_dim), applied as ``pooled @ proj``, is our ``proj`` transposed.
The embedding is ``encode_image``: the pooled token through ``proj``.

What the tensors do not say comes from ``open_clip_config.json`` (``model_cfg.vision_cfg``): the heads
(``width // head_width``), QuickGELU (``model_cfg.quick_gelu``), the LayerNorm eps (``norm_kwargs``), the pooling.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ....base._deps import require
from ....base.errors import CheckpointError
from ....base.preprocess_spec import CLIP_MEAN, CLIP_STD, PreprocessSpec
from ...provenance import CHECKPOINT, LIBRARY, Preprocessing, describe_spec, override_hint
from ..shared import infer_config

if TYPE_CHECKING:  # pragma: no cover
    from ....base.vit_schema import ViTConfig

CONFIG_FILE = "open_clip_config.json"
#: the weights open_clip looks for in a folder (its factory's order: safetensors first)
WEIGHT_FILES = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.safetensors",
    "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth",
)
VISUAL = "visual."
_TOP = {
    "conv1.weight": "patch_embed.proj.weight",
    "class_embedding": "cls_token",
    "positional_embedding": "pos_embed",
    "ln_pre.weight": "norm_pre.weight",
    "ln_pre.bias": "norm_pre.bias",
}
_BLOCK = {
    "ln_1.": "norm1.",
    "ln_2.": "norm2.",
    "attn.in_proj_weight": "attn.qkv.weight",
    "attn.in_proj_bias": "attn.qkv.bias",
    "attn.out_proj.": "attn.proj.",
    "mlp.c_fc.": "mlp.fc1.",
    "mlp.c_proj.": "mlp.fc2.",
    "ls_1.gamma": "ls1.gamma",
    "ls_2.gamma": "ls2.gamma",
}
_BLOCK_RE = re.compile(r"^transformer\.resblocks\.(\d+)\.(.+)$")
#: our names (vitdeploy's keys) that the keys of our ViT use: a state dict with them is converted already
_OURS = ("patch_embed.proj.weight",)
#: vision_cfg switches of open_clip's ViT that vitdeploy's network does not have -> what they are
_REFUSED_SWITCHES = {
    "attentional_pool": "attention pooling (CoCa's attentional pooler)",
    "qk_norm": "qk-norm in open_clip's custom block",
    "scaled_cosine_attn": "scaled cosine attention",
    "scale_heads": "per-head attention scales",
    "scale_attn_inner": "a norm on the attention output",
    "scale_attn": "a norm after the attention",
    "scale_fc": "a norm inside the MLP",
}
#: open_clip pool_type -> ours ('none': no pooling, every token: not a vector)
_POOLS = {"tok": "token", "avg": "avg"}


def is_open_clip_config(meta: dict[str, Any]) -> bool:
    """open_clip_config.json as the Hub holds it (``model_cfg``), or a model config itself (``vision_cfg``)."""
    return isinstance(meta.get("model_cfg"), dict) or isinstance(meta.get("vision_cfg"), dict)


def model_cfg(meta: dict[str, Any]) -> dict[str, Any]:
    """``model_cfg`` of an open_clip_config.json (open_clip's ``config.get('model_cfg', config)``)."""
    cfg = meta.get("model_cfg", meta)
    return cfg if isinstance(cfg, dict) else {}


def vision_cfg(meta: dict[str, Any]) -> dict[str, Any]:
    cfg = model_cfg(meta).get("vision_cfg")
    return cfg if isinstance(cfg, dict) else {}


def looks_like_open_clip(keys: set[str]) -> bool:
    """An OpenCLIP state dict (its image tower ``visual.``), or the tower's alone (``conv1``, ``resblocks``)."""
    whole = any(k.startswith(VISUAL) for k in keys) and ("logit_scale" in keys or f"{VISUAL}conv1.weight" in keys)
    return whole or ("conv1.weight" in keys and any(k.startswith("transformer.resblocks.") for k in keys))


def final_norm_after_pool(meta: dict[str, Any]) -> bool:
    """``ln_post`` after the average pooling (our ``fc_norm``); for the class token both orders are the same."""
    vis = vision_cfg(meta)
    return bool(vis.get("final_ln_after_pool")) and vis.get("pool_type", "tok") == "avg"


def convert_open_clip_state_dict(state: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenCLIP -> vitdeploy naming (module doc); a state dict in our naming already comes back as it is. Unknown
    keys of the tower stay, under their own names, for strict loading to report."""
    if any(k in state for k in _OURS):
        return state
    torch = require("torch", "converting OpenCLIP checkpoints")
    if any(k.startswith(VISUAL) for k in state):
        state = {k[len(VISUAL) :]: v for k, v in state.items() if k.startswith(VISUAL)}
    post = "fc_norm." if final_norm_after_pool(meta or {}) else "norm."
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key in _TOP:
            out[_TOP[key]] = value
        elif key.startswith("ln_post."):
            out[post + key[len("ln_post.") :]] = value
        elif key == "proj" and value.ndim == 2:
            out["proj.weight"] = value.t()
        elif m := _BLOCK_RE.match(key):
            rest = m.group(2)
            new = next((rest.replace(a, b, 1) for a, b in _BLOCK.items() if rest.startswith(a)), None)
            out[f"blocks.{m.group(1)}.{new}" if new else key] = value
        else:
            out[key] = value
    cls, pos = out.get("cls_token"), out.get("pos_embed")
    if cls is not None and cls.ndim == 1:
        out["cls_token"] = cls.reshape(1, 1, -1)
    if pos is not None and pos.ndim == 2:
        out["pos_embed"] = pos.unsqueeze(0)
    patch = out.get("patch_embed.proj.weight")
    if patch is not None and "norm_pre.weight" not in out and "patch_embed.proj.bias" not in out:
        out["patch_embed.proj.bias"] = torch.zeros(patch.shape[0], dtype=patch.dtype)  # no_ln_pre: the same sum
    return out


def open_clip_vit_config(
    state: dict[str, Any],
    meta: dict[str, Any],
    where: Path,
    *,
    num_heads: int | None = None,
    act: str | None = None,
    layer_norm_eps: float | None = None,
) -> tuple["ViTConfig", str, tuple[str, ...]]:
    """(ViTConfig, heads origin, notes) of the tower: sizes from the tensors, the rest from ``model_cfg``;
    CheckpointError naming the part for what vitdeploy's ViT does not have. ``num_heads`` / ``act`` /
    ``layer_norm_eps``: what the caller says (pipeline.yaml), checked against the config where it states them."""
    cfg_all, vis = model_cfg(meta), vision_cfg(meta)
    _refuse_parts(cfg_all, vis, where)
    stated_act = _activation(cfg_all, vis, where) if meta else None
    stated_eps = _eps(vis, where) if meta else None
    for what, given, stated in (
        ("model.activation", act, stated_act),
        ("model.layer_norm_eps", layer_norm_eps, stated_eps),
    ):
        if given is not None and stated is not None and given != stated:
            raise CheckpointError(f"{where}: {what} is {given!r} but {CONFIG_FILE} says {stated!r}; drop {what}")
    width = _width(state, where)
    heads, origin, notes = _heads(vis, width, num_heads, where)
    pool = _POOLS[vis.get("pool_type", "tok")]
    family = {
        "norm_pre": "norm_pre.weight" in state,
        "layer_scale": any(k.endswith(".ls1.gamma") for k in state),
        "pool": pool,
        "fc_norm": final_norm_after_pool(meta),
        "pos_embed_prefix": True,
    }
    proj = state.get("proj.weight")
    if proj is not None and proj.ndim == 2:
        family["proj_dim"] = int(proj.shape[0])
    keys = {"patch": "patch_embed.proj.weight", "pos": "pos_embed", "fc1": "blocks.0.mlp.fc1.weight"}
    cfg, _ = infer_config(
        state,
        prefix_keys={**keys, "qkv_bias": r"^blocks\.\d+\.attn\.qkv\.bias$", "head": "head.weight"},
        block_pattern=r"^blocks\.(\d+)\.",
        where=where,
        fmt="open_clip",
        variant=None,
        heads=heads,
        heads_origin=origin,
        act=stated_act or act or "gelu",
        layer_norm_eps=stated_eps or layer_norm_eps or 1e-5,
        family=family,
    )
    _check_sizes(cfg, vis, where)
    return cfg, origin, notes


def _refuse_parts(cfg_all: dict[str, Any], vis: dict[str, Any], where: Path) -> None:
    def no(part: str) -> CheckpointError:
        return CheckpointError(f"{where}: the OpenCLIP image tower has {part}: a part vitdeploy's ViT does not have")

    if vis.get("timm_model_name"):
        raise no(f"a timm trunk (vision_cfg.timm_model_name {vis['timm_model_name']!r})")
    if isinstance(vis.get("layers"), (list, tuple)):
        raise no("a ResNet, not a ViT (vision_cfg.layers is a list: open_clip's ModifiedResNet)")
    found = [what for key, what in _REFUSED_SWITCHES.items() if vis.get(key)]
    if vis.get("block_type") not in (None, "default"):
        found.append(f"open_clip's {vis['block_type']!r} block")
    if found:
        raise no(", ".join(found))
    if vis.get("pool_type", "tok") not in _POOLS:
        raise no(f"pool_type {vis.get('pool_type')!r} (no pooled vector; 'tok' and 'avg' load)")
    size = vis.get("image_size", 224)
    if isinstance(size, (list, tuple)) and len(set(size)) != 1:
        raise no(f"a non-square input ({size}); vitdeploy's ViT is square")


def _activation(cfg_all: dict[str, Any], vis: dict[str, Any], where: Path) -> str:
    """QuickGELU (``quick_gelu``) or GELU, with ``act_kwargs`` {"approximate": "tanh"} the tanh GELU."""
    kwargs = vis.get("act_kwargs") or {}
    quick = bool(cfg_all.get("quick_gelu", False))
    if not kwargs:
        return "quick_gelu" if quick else "gelu"
    if not quick and kwargs == {"approximate": "tanh"}:
        return "gelu_tanh"
    raise CheckpointError(
        f"{where}: vision_cfg.act_kwargs {kwargs} is not supported (GELU, tanh GELU, QuickGELU load)"
    )


def _eps(vis: dict[str, Any], where: Path) -> float:
    kwargs = vis.get("norm_kwargs") or {}
    eps = kwargs.get("eps", 1e-5)  # open_clip's LayerNorm: torch's default eps
    if set(kwargs) - {"eps"} or isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CheckpointError(f"{where}: vision_cfg.norm_kwargs {kwargs} is not supported (only eps, 0 < eps < 1)")
    return float(eps)


def _width(state: dict[str, Any], where: Path) -> int:
    patch = state.get("patch_embed.proj.weight")
    if any(k.startswith("trunk.") for k in state):
        raise CheckpointError(f"{where}: the OpenCLIP image tower is a timm trunk (visual.trunk.*), not its own ViT")
    if patch is None or patch.ndim != 4:
        raise CheckpointError(f"{where}: an OpenCLIP checkpoint without its image tower's conv1 (visual.conv1.weight)")
    return int(patch.shape[0])


def _heads(vis: dict[str, Any], width: int, num_heads: int | None, where: Path) -> tuple[int, str, tuple[str, ...]]:
    head_width = vis.get("head_width")
    if head_width is not None:
        if isinstance(head_width, bool) or not isinstance(head_width, int) or head_width <= 0 or width % head_width:
            raise CheckpointError(f"{where}: vision_cfg.head_width {head_width!r} does not divide the width {width}")
        heads = width // head_width
        if num_heads is not None and num_heads != heads:
            raise CheckpointError(
                f"{where}: model.num_heads is {num_heads} but {CONFIG_FILE} says {heads} (head_width {head_width})"
            )
        return heads, f"{CHECKPOINT}: {CONFIG_FILE} vision_cfg.head_width {head_width}", ()
    if num_heads is not None:
        return num_heads, "pipeline.yaml: model.num_heads", ()
    if width % 64:
        raise CheckpointError(
            f"{where}: width {width} is not a multiple of open_clip's head width 64: set model.num_heads"
        )
    origin = f"library default (assumed): open_clip's head_width 64 (width {width}); set model.num_heads if not"
    return width // 64, origin, ()


def _check_sizes(cfg: "ViTConfig", vis: dict[str, Any], where: Path) -> None:
    """The config's sizes, where it states them, must be the tensors' (open_clip would resample, or fail)."""
    size = vis.get("image_size")
    stated = {
        "width": vis.get("width"),
        "layers": vis.get("layers"),
        "patch_size": vis.get("patch_size"),
        "image_size": size[0] if isinstance(size, (list, tuple)) else size,
    }
    ours = {"width": cfg.width, "layers": cfg.depth, "patch_size": cfg.patch_size, "image_size": cfg.image_size}
    wrong = [f"{k} {v} (tensors: {ours[k]})" for k, v in stated.items() if v is not None and v != ours[k]]
    if wrong:
        raise CheckpointError(f"{where}: {CONFIG_FILE} vision_cfg does not match the weights: {', '.join(wrong)}")


def open_clip_preprocess(meta: dict[str, Any], cfg: "ViTConfig", where: Path) -> Preprocessing:
    """open_clip's eval transform (``image_transform(is_train=False)``) from ``preprocess_cfg`` over open_clip's
    ``PreprocessCfg`` defaults (OpenAI's mean / std, bicubic, ``resize_mode`` shortest): shortest side resized
    to the image size then centre-cropped is timm's centre crop at crop_pct 1.0 (the same torchvision Resize and
    CenterCrop); ``squash`` is timm's squash; ``longest`` (padded with ``fill_color``) is refused."""
    pp = meta.get("preprocess_cfg") if isinstance(meta.get("preprocess_cfg"), dict) else {}
    mode = pp.get("resize_mode", "shortest")
    if mode not in ("shortest", "squash"):
        raise CheckpointError(
            f"{where}: preprocess_cfg resize_mode {mode!r} (resize the longer side, pad with fill_color) is not "
            "reproduced; set preprocess in pipeline.yaml"
        )
    interpolation = pp.get("interpolation", "bicubic")
    interpolation = "bicubic" if interpolation == "random" else interpolation  # open_clip: bicubic at inference
    if interpolation not in ("bicubic", "bilinear"):
        raise CheckpointError(f"{where}: preprocess_cfg interpolation {interpolation!r} is not bicubic or bilinear")
    try:
        spec = PreprocessSpec(
            style="timm",
            height=cfg.image_size,
            width=cfg.image_size,
            crop_pct=1.0,
            interpolation=interpolation,
            crop_mode="center" if mode == "shortest" else "squash",
            mean=_triple(pp.get("mean", CLIP_MEAN)),
            std=_triple(pp.get("std", CLIP_STD)),
        )
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{where}: unusable preprocess_cfg: {exc}") from exc
    default = f"{LIBRARY}: open_clip PreprocessCfg"
    if not meta:  # a bare state dict: open_clip's defaults, said in a note
        note = (
            f"{where.name}: no {CONFIG_FILE}; assumed open_clip's default preprocessing ({describe_spec(spec)}); "
            f"{override_hint()}"
        )
        return Preprocessing.from_source(spec, default, notes=(note,))
    keys = {"mean": "mean", "std": "std", "interpolation": "interpolation", "crop_mode": "resize_mode"}
    missing = {field: default for field, key in keys.items() if key not in pp}
    missing.update(height=f"{CHECKPOINT}: vision_cfg.image_size", width=f"{CHECKPOINT}: vision_cfg.image_size")
    missing["crop_pct"] = default
    origin = f"{CHECKPOINT}: {CONFIG_FILE} preprocess_cfg"
    return Preprocessing.from_source(spec, origin, missing)


def _triple(value: Any) -> tuple[float, float, float]:
    items = value if isinstance(value, (list, tuple)) else [value] * 3
    if len(items) != 3 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in items):
        raise ValueError(f"mean / std must be three numbers, got {value!r}")
    return tuple(float(v) for v in items)  # type: ignore[return-value]
