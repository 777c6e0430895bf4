"""Reading checkpoint files safely and the helpers every checkpoint format shares.

Nothing here knows a format's key naming (that lives in ``convert_*.py``); this module reads
bytes into a flat ``{name: tensor}`` dict, refusing anything that is not plain tensors, and
infers what the tensors cannot say (attention heads) from the standard variants.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ...base._deps import require
from ...base.errors import CheckpointError
from ...base.vit_schema import HEADS_BY_WIDTH, SIZE_BY_WIDTH, VARIANTS, ViTConfig  # noqa: F401 - the sizes, defined once

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

_SIZE_WORDS = {
    "tiny": "tiny",
    "ti": "tiny",
    "small": "small",
    "s": "small",
    "base": "base",
    "b": "base",
    "large": "large",
    "l": "large",
    "huge": "huge",
    "h": "huge",
    "giant": "giant",  # DINOv2's (SwiGLU); timm's vit_giant_patch14_224 (CLIP's, 1408 wide) is not a variant here
    "g": "giant",
}
# The wrappers training scripts put around a state dict, tried in this order.
_WRAPPER_KEYS = ("state_dict", "model", "model_state_dict")


def shorten(items: Iterable[str], limit: int = 8) -> str:
    """``a, b, c ... and 12 more`` (sorted), for error messages about long key lists."""
    items = sorted(items)
    shown = ", ".join(items[:limit])
    return shown + (f" ... and {len(items) - limit} more" if len(items) > limit else "")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: file not found") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc}); restore or regenerate the file") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


# --------------------------------------------------------------------------- file kinds


def sniff(path: Path) -> str:
    """'safetensors', 'torch-zip' or 'torch-pickle' from the file's first bytes, not its name."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(9)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: file not found") from exc
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc})") from exc
    if len(head) == 9:
        (header_len,) = struct.unpack("<Q", head[:8])
        if 2 <= header_len <= size - 8 and head[8:9] == b"{":
            return "safetensors"
    if head.startswith(b"PK\x03\x04"):
        return "torch-zip"
    if head[:1] == b"\x80":
        return "torch-pickle"
    raise CheckpointError(
        f"{path}: not a checkpoint: it is neither a safetensors file nor a PyTorch (torch.save) file "
        f"({size} bytes, starts with {head[:8]!r}); the file is corrupt or of another kind"
    )


def safetensors_keys(path: Path) -> list[str]:
    """Tensor names from a safetensors header without reading the tensors."""
    safe_open = require("safetensors", "reading .safetensors checkpoints").safe_open
    try:
        with safe_open(str(path), framework="pt") as fh:
            return list(fh.keys())
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(f"{path}: corrupt safetensors file ({exc}); re-download or re-save it") from exc


def weight_keys(path: Path) -> tuple[set[str], dict[str, "torch.Tensor"] | None]:
    """The tensor names of a weights file (wrapper prefixes stripped), and its tensors when reading the
    names meant reading them (a pickle; a safetensors header is read alone: None)."""
    if sniff(path) == "safetensors":
        return set(strip_prefixes(dict.fromkeys(safetensors_keys(path)))), None
    state = read_state_dict(path)
    return set(state), state


def read_state_dict(path: Path) -> dict[str, "torch.Tensor"]:
    """A flat ``{name: tensor}`` dict from a safetensors or torch.save file (weights_only only).

    ``{"state_dict": ...}`` / ``{"model": ...}`` wrappers are unwrapped and a ``module.`` / ``_orig_mod.`` /
    ``model.`` prefix shared by every key is removed. Anything other than tensors inside is refused.
    """
    kind = sniff(path)
    if kind == "safetensors":
        load_file = require("safetensors.torch", "reading .safetensors checkpoints").load_file
        try:
            obj: Any = load_file(str(path), device="cpu")
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{path}: corrupt safetensors file ({exc}); re-download or re-save it") from exc
    else:
        obj = _torch_load(path)
    return _flatten(obj, path)


def _torch_load(path: Path) -> Any:
    torch = require("torch", "reading PyTorch checkpoints")
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = next(
            (ln.strip() for ln in str(exc).splitlines() if "Unsupported" in ln or "WeightsUnpickler" in ln),
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        raise CheckpointError(
            f"{path}: refused as unsafe: this PyTorch pickle needs more than tensors to load ({reason}), and "
            "vitdeploy only loads checkpoints with torch.load(weights_only=True) because a pickle can run "
            "arbitrary code. If you trust its source, convert it once in a separate trusted session: "
            "`sd = torch.load(path, weights_only=False); sd = sd.get('state_dict', sd); "
            "safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')` "
            "and load the .safetensors file"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError/EOFError/... for broken files
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{path}: corrupt or unreadable PyTorch checkpoint ({first}); re-download or re-save it"
        ) from exc


def _flatten(obj: Any, path: Path) -> dict[str, "torch.Tensor"]:
    torch = require("torch", "reading checkpoints")
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"{path}: expected a state dict (a dict of tensors), got {type(obj).__name__}; "
            "save model.state_dict(), not the model object"
        )
    for key in _WRAPPER_KEYS:
        inner = obj.get(key)
        if isinstance(inner, dict) and inner:
            logger.debug("%s: using the state dict under %r", path, key)
            obj = inner
            break
    non_tensors = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if non_tensors:
        raise CheckpointError(
            f"{path}: expected a state dict of tensors, but these entries are not tensors: "
            f"{shorten(map(str, non_tensors))}; "
            "save model.state_dict() (or wrap it as {'state_dict': ...})"
        )
    return strip_prefixes(dict(obj))


# Prefixes wrappers add to every key: DistributedDataParallel, torch.compile, Lightning's `self.model`.
_COMMON_PREFIXES = ("module.", "_orig_mod.", "model.")


def strip_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """Remove a wrapper prefix shared by every key (repeatedly: ``module._orig_mod.`` ...)."""
    changed = True
    while state and changed:
        changed = False
        for prefix in _COMMON_PREFIXES:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix) :]: v for k, v in state.items()}
                changed = True
    return state


def to_float32(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    torch = require("torch", "loading checkpoints")
    return {k: (v.float() if torch.is_floating_point(v) else v) for k, v in state.items()}


# --------------------------------------------------------------------------- architecture helpers


def layer_count(keys: Iterable[str], prefix_pattern: str) -> int:
    """Number of layers from keys like ``blocks.3.x`` (prefix_pattern has one ``(\\d+)`` group)."""
    regex = re.compile(prefix_pattern)
    found = {int(m.group(1)) for k in keys if (m := regex.match(k))}
    if not found:
        return 0
    if found != set(range(max(found) + 1)):
        missing = sorted(set(range(max(found) + 1)) - found)
        raise CheckpointError(f"layer numbers are not contiguous: layers {missing} are missing")
    return max(found) + 1


def variant_template(variant: str):
    """The VARIANTS entry a variant name means: 'vit_base_patch16_224', 'vit_base_patch16_224.augreg_in21k',
    'base', 'vit_b_16' (torchvision), 'B/16' ... -> ViTConfig (only width/depth/heads/patch matter)."""
    name = variant.strip().lower()
    if name in VARIANTS:
        return VARIANTS[name]
    base = name.split(".")[0]
    if base in VARIANTS:
        return VARIANTS[base]
    size = patch = None
    m = re.match(r"^(?:vit|deit|eva02|eva)_(tiny|small|base|large|huge|giant|so400m)_patch(\d+)", base)
    if m and (m.group(1) != "giant" or base.endswith("_dinov2")):  # timm's other giants are not DINOv2's
        size, patch = m.group(1), int(m.group(2))
    elif m := re.match(r"^vit_([tsblh])_(\d+)$", base):  # torchvision names
        size, patch = _SIZE_WORDS[m.group(1)], int(m.group(2))
    elif m := re.match(r"^(ti|tiny|s|small|b|base|l|large|h|huge|g|giant)(?:[/-](\d+))?$", base):
        size, patch = _SIZE_WORDS[m.group(1)], int(m.group(2)) if m.group(2) else None
    if size is None:
        sizes = sorted({k.split("_")[1] for k in VARIANTS})
        raise CheckpointError(f"unknown variant {variant!r}; use one of {sorted(VARIANTS)} or a size name {sizes}")
    template = next(cfg for key, cfg in VARIANTS.items() if key.startswith(f"vit_{size}_"))
    return (
        template
        if patch is None
        else ViTConfig(
            image_size=patch * 14,
            patch_size=patch,
            width=template.width,
            depth=template.depth,
            heads=template.heads,
            mlp_ratio=template.mlp_ratio,
            mlp=template.mlp,
        )
    )


def resolve_heads(width: int, depth: int, patch: int, variant: str | None, where: Path) -> tuple[int, str]:
    """(heads, where that came from) for a checkpoint that does not store them: from ``variant`` when
    given (checked against the tensors), else assumed from the standard variant of that width
    (said in the origin, which starts with "assumed"); any other width is an error naming the key to set."""
    if variant is not None:
        tmpl = variant_template(variant)
        check_variant(tmpl, variant, width=width, depth=depth, patch=patch, where=where)
        return tmpl.heads, f"pipeline.yaml: model.variant {variant}"
    if width in HEADS_BY_WIDTH:
        heads = HEADS_BY_WIDTH[width]
        name = f"vit_{SIZE_BY_WIDTH[width]}"
        logger.info("%s: no head count stored; assuming %d heads (%s)", where, heads, name)
        return heads, (
            f"library default (assumed): width {width} is {name}'s, which has {heads} heads; the checkpoint "
            "does not store it (set model.num_heads in pipeline.yaml if yours differs)"
        )
    standard = ", ".join(f"{w} ({SIZE_BY_WIDTH[w]})" for w in HEADS_BY_WIDTH)
    raise CheckpointError(
        f"{where}: the checkpoint does not store its number of attention heads and width {width} is not a "
        f"standard variant's ({standard}); set model.num_heads in pipeline.yaml (load_checkpoint(num_heads=...))"
    )


def check_stated_variant(variant: str | None, cfg: ViTConfig, where: Path) -> None:
    """When the caller named a variant (``model.variant``), the config read from the checkpoint must be it."""
    if variant is not None:
        check_variant(
            variant_template(variant),
            variant,
            width=cfg.width,
            depth=cfg.depth,
            patch=cfg.patch_size,
            heads=cfg.heads,
            where=where,
        )


def check_variant(
    tmpl, variant: str, *, width: int, depth: int, patch: int, where: Path, heads: int | None = None
) -> None:
    """Raise when the checkpoint contradicts the variant the caller named."""
    problems = []
    if tmpl.width != width:
        problems.append(f"width {width} (variant: {tmpl.width})")
    if tmpl.depth != depth:
        problems.append(f"depth {depth} (variant: {tmpl.depth})")
    named_patch = re.search(r"patch(\d+)|_(\d+)$|/(\d+)$", variant.split(".")[0])
    if named_patch and tmpl.patch_size != patch:
        problems.append(f"patch size {patch} (variant: {tmpl.patch_size})")
    if heads is not None and tmpl.heads != heads:
        problems.append(f"heads {heads} (variant: {tmpl.heads})")
    if problems:
        raise CheckpointError(
            f"{where}: the checkpoint does not match variant {variant!r}: it has {', '.join(problems)}; "
            "drop variant= or name the right one"
        )


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def _need(state: dict[str, Any], key: str, where: Path, fmt: str) -> "torch.Tensor":
    if key not in state:
        raise CheckpointError(
            f"{where}: looks like a {fmt} ViT checkpoint but has no {key!r}, needed to infer the "
            "architecture; the file is incomplete or not a standard ViT"
        )
    return state[key]


def infer_config(
    state: dict[str, "torch.Tensor"],
    *,
    prefix_keys: dict[str, str],
    block_pattern: str,
    where: Path,
    fmt: str,
    variant: str | None,
    heads: int | None = None,
    heads_origin: str = "",
    act: str = "gelu",
    layer_norm_eps: float = 1e-6,
    family: dict[str, Any] | None = None,
) -> tuple["ViTConfig", str]:
    """(ViTConfig, where the head count came from) from tensor shapes. ``prefix_keys`` names where the
    tensors are (``patch``, ``pos``, ``fc1``, ``head``: keys; ``qkv_bias``: a regex, qkv biases exist
    when any key matches it). ``heads``: known head count (else :func:`resolve_heads`). ``family``:
    the ViTConfig fields of the close relatives (prefix tokens, pooling ...; default: the paper's ViT);
    whether the position table has rows for the prefix tokens is read from its length."""
    from ..vit import ViTConfig

    proj = _need(state, prefix_keys["patch"], where, fmt)
    if proj.ndim != 4 or proj.shape[2] != proj.shape[3]:
        raise CheckpointError(
            f"{where}: {prefix_keys['patch']} has shape {tuple(proj.shape)}; expected (width, C, p, p)"
        )
    width, channels, patch = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[2])
    depth = layer_count(state, block_pattern)
    if depth == 0:
        raise CheckpointError(f"{where}: looks like a {fmt} ViT checkpoint but holds no transformer blocks")
    family = dict(family or {})
    prefix = int(family.get("class_token", True)) + int(family.get("distilled", False)) + family.get("reg_tokens", 0)
    pos = _need(state, prefix_keys["pos"], where, fmt)
    rows = int(pos.shape[-2])
    with_prefix = [p for p in ((prefix, True), (0, False)) if _is_square(rows - p[0])]
    if "pos_embed_prefix" in family:
        with_prefix = [p for p in with_prefix if p[1] == family["pos_embed_prefix"]]
    if not with_prefix:
        raise CheckpointError(
            f"{where}: {prefix_keys['pos']} has {rows} rows: neither {prefix} prefix token(s) + a square grid nor "
            "a square grid alone; the position table does not fit the tokens the checkpoint has"
        )
    family["pos_embed_prefix"] = with_prefix[0][1]
    tokens = rows - with_prefix[0][0]
    grid = math.isqrt(tokens)
    fc1 = int(_need(state, prefix_keys["fc1"], where, fmt).shape[0])
    mlp = fc1 // 2 if family.get("mlp") == "swiglu" else fc1  # SwiGLU: fc1 writes the gate and the value
    head = state.get(prefix_keys["head"])
    if heads is None:
        heads, heads_origin = resolve_heads(width, depth, patch, variant, where)
    try:
        cfg = ViTConfig(
            image_size=grid * patch,
            patch_size=patch,
            in_channels=channels,
            width=width,
            depth=depth,
            heads=heads,
            mlp_ratio=mlp / width,
            qkv_bias=any(re.match(prefix_keys["qkv_bias"], k) for k in state),
            layer_norm_eps=layer_norm_eps,
            num_classes=int(head.shape[0]) if head is not None else 0,
            act=act,
            **family,
        )
    except ValueError as exc:
        raise CheckpointError(f"{where}: inferred an invalid ViT from the tensors: {exc}") from exc
    if cfg.fc1_dim != fc1:
        raise CheckpointError(f"{where}: MLP width {fc1} cannot be represented for width {width}")
    logger.info("%s: inferred %s ViT: %s", where, fmt, cfg)
    return cfg, heads_origin
