"""Load a ViT checkpoint of any supported format into :class:`VisionTransformer`; save our own format.

Formats are recognised from the contents of the file or directory, not its name:

* ``vitdeploy``: a directory with ``model.json`` (``"format": "vitdeploy"``) and ``model.safetensors``,
  or either file inside it.
* ``hf``: a Hugging Face ``ViTForImageClassification`` / ``ViTModel`` / DeiT / DINOv2 directory (``config.json`` +
  ``model.safetensors`` or ``pytorch_model.bin``, sharded or not), or a weights file inside it.
* ``timm``: a timm ``vision_transformer`` state dict (.safetensors or a torch.save file), or a timm hub
  directory (``config.json`` with ``architecture``).
* ``torchvision``: a torchvision ``vit_*`` state dict.

Loading is strict: every parameter of the model must come from the checkpoint with the right shape
and nothing may be left over, otherwise :class:`CheckpointError` lists what does not fit.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .._deps import require
from .._files import atomic_path
from ..errors import CheckpointError
from ..preprocess_spec import PreprocessSpec
from ..vocab import CHECKPOINT_CONFIG, CHECKPOINT_WEIGHTS
from . import convert_hf, convert_timm, convert_torchvision
from .config_schema import check_checkpoint_config
from .provenance import CHECKPOINT, CONFIG, Preprocessing
from .formats import (check_variant, read_json, read_state_dict, safetensors_keys, shorten, sniff, strip_prefixes,
                      to_float32, variant_template)

if TYPE_CHECKING:  # pragma: no cover

    from .vit import ViTConfig, VisionTransformer

logger = logging.getLogger(__name__)

OUR_FORMAT, OUR_VERSION = "vitdeploy", 1
OUR_WEIGHTS, OUR_META = CHECKPOINT_WEIGHTS, CHECKPOINT_CONFIG
_WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


@dataclass(frozen=True)
class LoadedCheckpoint:
    model: "VisionTransformer"  # eval(), float32, weights loaded strictly
    config: "ViTConfig"
    labels: tuple[str, ...]
    preprocess: PreprocessSpec | None  # None only for a vitdeploy checkpoint saved without one
    source_format: str  # "vitdeploy" | "timm" | "hf" | "torchvision"
    name: str
    # Where each relevant preprocess field came from ("checkpoint: ...", "library default: ...", "pipeline.yaml: ...").
    preprocess_origins: dict[str, str] = field(default_factory=dict)
    heads_origin: str = ""
    native_image_size: int = 0  # the checkpoint's own image size (differs when position embeddings were resampled)
    notes: tuple[str, ...] = ()  # assumptions made for what the checkpoint does not say, each with its override


@dataclass
class _Source:
    """What a path turned out to be, before the tensors are converted."""

    format: str
    where: Path  # the path to name in messages
    weights: list[Path] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # model.json / config.json
    meta_dir: Path | None = None
    state: dict[str, Any] | None = None  # already read while detecting
    name: str = ""


# --------------------------------------------------------------------------- detection

def detect_format(path: str | os.PathLike) -> str:
    """"vitdeploy", "timm", "hf" or "torchvision", from the contents; CheckpointError otherwise."""
    return _resolve(Path(path)).format


def _resolve(path: Path) -> _Source:
    path = path.expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory; give a checkpoint file or directory")
    if path.is_dir():
        return _resolve_dir(path)
    if path.suffix == ".json":
        meta = read_json(path)
        if meta.get("format") == OUR_FORMAT:
            return _our_source(path, meta)
        if path.name == "config.json":
            return _resolve_dir(path.parent, use_ours=False)
        raise CheckpointError(f"{path}: a JSON file that is neither a vitdeploy model.json nor a config.json")
    return _resolve_file(path)


def _our_source(meta_path: Path, meta: dict[str, Any], where: Path | None = None) -> _Source:
    d = meta_path.parent
    return _Source(OUR_FORMAT, where or meta_path, [d / OUR_WEIGHTS], meta, d, name=str(meta.get("name") or d.name))


def _resolve_dir(d: Path, use_ours: bool = True) -> _Source:
    meta_path = d / OUR_META
    if use_ours and meta_path.is_file():
        meta = read_json(meta_path)
        if meta.get("format") == OUR_FORMAT:
            return _our_source(meta_path, meta)
    config_path = d / "config.json"
    if config_path.is_file():
        config = read_json(config_path)
        if convert_hf.is_hf_config(config):
            return _Source("hf", d, _hf_weight_files(d), config, d, name=d.name)
        if convert_timm.is_timm_config(config):
            weights = [d / f for f in convert_timm.WEIGHT_FILES if (d / f).is_file()][:1]
            if not weights:
                raise CheckpointError(f"{d}: timm config.json but no {' or '.join(convert_timm.WEIGHT_FILES)}")
            src = _resolve_file(weights[0], use_neighbours=False)
            if src.format != "timm":
                raise CheckpointError(f"{weights[0]}: config.json says timm but the weights are {src.format}")
            src.meta, src.meta_dir, src.name, src.where = config, d, str(config.get("architecture") or d.name), d
            return src
        raise CheckpointError(f"{config_path}: not a Hugging Face ViT config (no model_type) nor a timm config (no architecture)")
    candidates = sorted(p for p in d.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if len(candidates) == 1:
        return _resolve_file(candidates[0])
    raise CheckpointError(
        f"{d}: not a checkpoint directory: no model.json (vitdeploy) or config.json (Hugging Face / timm)"
        + (f", and {len(candidates)} weight files ({shorten(p.name for p in candidates)}); give one file"
           if candidates else ", and no weights file")
    )


def _hf_weight_files(d: Path) -> list[Path]:
    for name in convert_hf.WEIGHT_FILES:
        if (d / name).is_file():
            return [d / name]
    for name in convert_hf.INDEX_FILES:
        if (d / name).is_file():
            weight_map = read_json(d / name).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{d / name}: no weight_map")
            return [d / f for f in sorted(set(weight_map.values()))]
    raise CheckpointError(
        f"{d}: Hugging Face config.json but no weights ({', '.join(convert_hf.WEIGHT_FILES + convert_hf.INDEX_FILES)})"
    )


def _resolve_file(path: Path, use_neighbours: bool = True) -> _Source:
    parent = path.parent
    if use_neighbours and path.name == OUR_WEIGHTS and (parent / OUR_META).is_file():
        meta = read_json(parent / OUR_META)
        if meta.get("format") == OUR_FORMAT:
            return _our_source(parent / OUR_META, meta, where=path)
    if use_neighbours and (parent / "config.json").is_file():
        config = read_json(parent / "config.json")
        if convert_hf.is_hf_config(config):
            return _Source("hf", path, [path], config, parent, name=parent.name)
        if convert_timm.is_timm_config(config) and path.name in convert_timm.WEIGHT_FILES:
            return _resolve_dir(parent, use_ours=False)
    kind = sniff(path)
    state = None
    if kind == "safetensors":
        keys = set(safetensors_keys(path))
    else:
        state = read_state_dict(path)
        keys = set(state)
    if kind == "safetensors":
        keys = set(strip_prefixes(dict.fromkeys(keys)))
    if convert_timm.looks_like_timm(keys):
        fmt = "timm"
    elif convert_torchvision.looks_like_torchvision(keys):
        fmt = "torchvision"
    elif any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in keys):
        raise CheckpointError(
            f"{path}: a Hugging Face ViT state dict without its config.json; load the directory written by "
            "save_pretrained (config.json + weights) so heads, eps and labels are known"
        )
    else:
        raise CheckpointError(
            f"{path}: unknown checkpoint format: the keys match none of timm (patch_embed.proj, blocks.N), "
            f"torchvision (conv_proj, encoder.layers), Hugging Face or vitdeploy; first keys: {shorten(keys, 6)}"
        )
    return _Source(fmt, path, [path], state=state, name=path.stem)


# --------------------------------------------------------------------------- loading

def load_checkpoint(path: str | os.PathLike, *, image_size: int | None = None, num_classes: int | None = None,
                    variant: str | None = None, num_heads: int | None = None, act: str | None = None,
                    layer_norm_eps: float | None = None, pool: str | None = None) -> LoadedCheckpoint:
    """Load ``path`` strictly into a float32 VisionTransformer in eval mode.

    image_size: build the model for this input size; learned position embeddings are resampled
        (bicubic) from the checkpoint's grid, and the preprocessing size follows. Without it a Hugging
        Face DINOv2 model is built for its processor's crop (transformers resamples to its input).
    num_classes: a check, not a head reset: CheckpointError unless the checkpoint's head has exactly
        this many outputs (0 = features only).
    variant: heads for formats that do not store them (timm, torchvision), e.g. 'vit_base_patch16_224';
        checked against the tensors and, for hf / vitdeploy, against the stored config.
    num_heads / act ("gelu" | "gelu_tanh") / layer_norm_eps: what a bare state dict cannot say
        (pipeline.yaml model.num_heads / model.activation / model.layer_norm_eps); where the checkpoint
        stores them, a different value is an error.
    pool ("token" | "avg" | "token_avg"): the pooling of a timm state dict without config.json (pipeline.yaml
        model.pool); checked against the pooling other checkpoints state.
    What was assumed is in the result's ``notes``; where each value came from in its origins.
    """
    src = _resolve(Path(path))
    check_checkpoint_config(src.format, src.meta, src.meta_dir)  # every stated value, before any use
    where = src.where
    state = src.state if src.state is not None else _read_all(src.weights)
    state = to_float32(state)
    labels: tuple[str, ...] | None = None
    pre: Preprocessing | None = None
    heads_origin = ""
    family_notes: tuple[str, ...] = ()

    if src.format == OUR_FORMAT:
        cfg, labels, spec = _our_meta(src.meta, where)
        if variant is not None:
            check_variant(variant_template(variant), variant, width=cfg.width, depth=cfg.depth,
                          patch=cfg.patch_size, heads=cfg.heads, where=where)
        heads_origin = f"{CHECKPOINT}: {OUR_META}"
        if spec is not None:
            pre = Preprocessing.from_source(spec, f"{CHECKPOINT}: {OUR_META}")
    elif src.format == "hf":
        state = convert_hf.convert_hf_state_dict(state)
        head = state.get("head.weight")
        cfg = convert_hf.hf_vit_config(src.meta, int(head.shape[0]) if head is not None else 0, where, state)
        if variant is not None:
            check_variant(variant_template(variant), variant, width=cfg.width, depth=cfg.depth,
                          patch=cfg.patch_size, heads=cfg.heads, where=where)
        heads_origin = f"{CHECKPOINT}: config.json num_attention_heads"
        labels = convert_hf.hf_labels(src.meta, cfg.num_classes, where)
        pp_path = src.meta_dir / "preprocessor_config.json" if src.meta_dir else None
        if pp_path is not None and pp_path.is_file():
            pre = convert_hf.hf_preprocess(read_json(pp_path), cfg.image_size, pp_path)
        else:
            pre = _hf_default_preprocess(cfg.image_size, where)
    elif src.format == "timm":
        state = convert_timm.convert_timm_state_dict(state)
        cfg, heads_origin, family_notes = convert_timm.timm_vit_config(
            state, where, variant, src.meta or None, num_heads=num_heads, act=act, layer_norm_eps=layer_norm_eps,
            pool=pool)
        if src.meta:
            labels = convert_timm.timm_labels(src.meta, cfg.num_classes, where)
        pre = convert_timm.timm_preprocess(src.meta or None, cfg, where, variant)
    elif src.format == "torchvision":
        state = convert_torchvision.convert_torchvision_state_dict(state)
        cfg, heads_origin = convert_torchvision.torchvision_vit_config(state, where, variant, num_heads=num_heads,
                                                                       act=act, layer_norm_eps=layer_norm_eps)
        pre = convert_torchvision.torchvision_preprocess(cfg, where)
    else:  # pragma: no cover - _resolve only returns the four formats
        raise CheckpointError(f"{where}: unsupported format {src.format!r}")
    if src.format in (OUR_FORMAT, "hf"):
        _check_stored(cfg, where, num_heads=num_heads, act=act, layer_norm_eps=layer_norm_eps)
    if src.format != "timm":
        _check_stored(cfg, where, pool=pool)

    if num_classes is not None and num_classes != cfg.num_classes:
        raise CheckpointError(
            f"{where}: the checkpoint's head has {cfg.num_classes} classes but num_classes={num_classes} was "
            "asked for; vitdeploy does not silently reset a head. Drop num_classes, or fine-tune and save a "
            "checkpoint with the head you need"
        )
    native = cfg.image_size
    # transformers resamples a DINOv2 table to the input at every call (antialiased for the registers model only)
    antialias = convert_hf.DINOV2_RESAMPLE_ANTIALIAS.get(src.meta.get("model_type"), True) if src.format == "hf" else True
    follow = (convert_hf.dinov2_input_size(src.meta, cfg, pre.spec, where)
              if src.format == "hf" and image_size is None and pre is not None else None)
    if follow is not None:  # the processor's crop, not config.json's image_size, is what the model sees
        cfg, state, _ = _resize(cfg, state, None, follow, where, antialias=antialias)
        family_notes += (f"{where.name}: runs at the processor's {follow}x{follow} crop, not config.json's image_size "
                         f"{native}: the position table is resampled once (bicubic{', antialiased' if antialias else ''}) "
                         "as transformers resamples it at every call; model.image_size sets another size",)
    elif image_size is not None and image_size != cfg.image_size:
        cfg, state, pre = _resize(cfg, state, pre, image_size, where, antialias=antialias)

    model = _build_and_load(cfg, state, where, src.format)
    if labels is None:
        labels = tuple(f"class_{i}" for i in range(cfg.num_classes))
    notes = list(pre.notes if pre else ()) + list(family_notes)
    if heads_origin.startswith("library default (assumed)"):
        notes.insert(0, f"{where.name}: assumed {cfg.heads} attention heads: {heads_origin.split(': ', 1)[1]}")
    logger.info("loaded %s checkpoint %s: %s", src.format, where, cfg)
    return LoadedCheckpoint(model=model, config=cfg, labels=labels, preprocess=pre.spec if pre else None,
                            source_format=src.format, name=src.name,
                            preprocess_origins=dict(pre.origins) if pre else {}, heads_origin=heads_origin,
                            native_image_size=native, notes=tuple(notes))


def _check_stored(cfg: "ViTConfig", where: Path, **given: Any) -> None:
    """A value given for what the checkpoint stores must agree with it."""
    stored = {"num_heads": cfg.heads, "act": cfg.act, "layer_norm_eps": cfg.layer_norm_eps, "pool": cfg.pool}
    keys = {"num_heads": "model.num_heads", "act": "model.activation", "layer_norm_eps": "model.layer_norm_eps",
            "pool": "model.pool"}
    for name, value in given.items():
        if value is not None and value != stored[name]:
            raise CheckpointError(f"{where}: {keys[name]} is {value!r} but the checkpoint stores {stored[name]!r}; "
                                  f"drop {keys[name]} (it is only needed for checkpoints that do not store it)")


def _hf_default_preprocess(image_size: int, where: Path) -> Preprocessing:
    """A Hugging Face directory without preprocessor_config.json: ViTImageProcessor's defaults."""
    from .provenance import LIBRARY, describe_spec, override_hint

    spec = PreprocessSpec(style="hf", height=image_size, width=image_size, interpolation="bilinear")
    note = (f"{where}: no preprocessor_config.json; assumed transformers' ViTImageProcessor defaults "
            f"({describe_spec(spec)}); {override_hint()}")
    return Preprocessing.from_source(spec, f"{LIBRARY}: transformers ViTImageProcessor", notes=(note,))


def _read_all(files: Iterable[Path]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for f in files:
        part = read_state_dict(f)
        clash = set(part) & set(state)
        if clash:
            raise CheckpointError(f"{f}: tensors {shorten(clash)} also appear in another shard")
        state.update(part)
    return state


def _our_meta(meta: dict[str, Any], where: Path) -> tuple["ViTConfig", tuple[str, ...], PreprocessSpec | None]:
    from .vit import ViTConfig

    version = meta.get("version")
    if version != OUR_VERSION:
        raise CheckpointError(f"{where}: model.json version {version!r} is not supported (this vitdeploy reads {OUR_VERSION}); upgrade vitdeploy")
    try:
        cfg = ViTConfig.from_dict(dict(meta["vit"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: invalid 'vit' config in model.json: {exc}") from exc
    labels = meta.get("labels")
    if not isinstance(labels, list) or len(labels) != cfg.num_classes:
        raise CheckpointError(
            f"{where}: 'labels' must be a list of {cfg.num_classes} names (one per class), got "
            f"{len(labels) if isinstance(labels, list) else type(labels).__name__}"
        )
    preprocess = None
    if meta.get("preprocess") is not None:
        try:
            preprocess = PreprocessSpec.from_dict(meta["preprocess"])
        except (TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{where}: invalid 'preprocess' in model.json: {exc}") from exc
    return cfg, tuple(str(x) for x in labels), preprocess


def _resize(cfg: "ViTConfig", state: dict[str, Any], pre: Preprocessing | None, image_size: int,
            where: Path, antialias: bool = True) -> tuple["ViTConfig", dict[str, Any], Preprocessing | None]:
    from .vit import resample_pos_embed

    if image_size <= 0 or image_size % cfg.patch_size:
        raise CheckpointError(f"{where}: image_size {image_size} is not a positive multiple of the patch size {cfg.patch_size}")
    new_cfg = cfg.replace(image_size=image_size)
    pos = state.get("pos_embed")
    if cfg.pos_embed == "learned" and pos is not None and pos.ndim == 3 and pos.shape[1] == cfg.pos_len:
        state = {**state, "pos_embed": resample_pos_embed(pos, new_cfg.grid, cfg.pos_len - cfg.num_patches,
                                                          antialias=antialias)}
        logger.info("%s: resampled position embeddings from %dx%d to %dx%d", where, cfg.grid, cfg.grid,
                    new_cfg.grid, new_cfg.grid)
    if pre is not None:
        spec, scale = pre.spec, image_size / pre.spec.height
        # Sizes before the crop keep their ratio to the crop (timm's crop_pct does that by itself).
        scaled = {k: int(round(getattr(spec, k) * scale)) for k in ("resize_height", "resize_width", "shortest_edge",
                                                                     "longest_edge") if getattr(spec, k) is not None}
        changes = {"height": image_size, "width": image_size, **scaled}
        origins = {**pre.origins, **{k: f"{CONFIG}: model.image_size" for k in changes}}
        pre = Preprocessing(spec.replace(**changes), origins, pre.notes)
    return new_cfg, state, pre


def _build_and_load(cfg: "ViTConfig", state: dict[str, Any], where: Path, fmt: str) -> "VisionTransformer":
    """Build the model and load ``state`` strictly. Learned-position models are built on the meta
    device and take the checkpoint's tensors directly (no random init of weights that are replaced
    anyway: seconds saved for ViT-B and up)."""
    torch = require("torch", "loading checkpoints")
    from .vit import VisionTransformer

    on_meta = cfg.pos_embed == "learned"  # sincos has a computed, non-persistent table: build it for real
    try:
        if on_meta:
            with torch.device("meta"):
                model = VisionTransformer(cfg)
        else:
            model = VisionTransformer(cfg)
    except (ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{where}: cannot build the ViT {cfg}: {exc}") from exc
    _check_strict(model, state, where, fmt)
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True, assign=on_meta)
    leftover = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if leftover:  # pragma: no cover - _check_strict makes this unreachable
        raise CheckpointError(f"{where}: not loaded from the checkpoint: {shorten(leftover)}")
    return model.eval()


#: Parameter-name fragments (vitdeploy / timm naming) of parts vitdeploy's ViT does not have -> what they are.
_UNSUPPORTED_PARTS = {"norm_pre.": "a norm before the blocks (timm pre_norm / CLIP)",
                      "attn_pool.": "attention pooling (timm global_pool='map')",
                      "head.fc.": "a pre-logits layer", "pre_logits.": "a pre-logits layer",
                      ".attn.norm.": "a norm on the attention output (timm scale_attn_norm)",
                      ".mlp.norm.": "a norm inside the MLP (timm scale_mlp_norm)",
                      ".attn.gate.": "gated attention", "mask_token": "a mask token",
                      ".mlp.fc1_g.": "a gated MLP (SwiGLU)", ".mlp.w12.": "a gated MLP (SwiGLU)"}


def _unsupported_parts(unexpected: list[str]) -> str:
    """The sentence naming what the leftover keys are, where we know."""
    found = sorted({what for key in unexpected for frag, what in _UNSUPPORTED_PARTS.items() if frag in key})
    if found:
        return "The model has parts vitdeploy's ViT does not: " + ", ".join(found)
    return ("The file is incomplete or edited, or the model has parts vitdeploy's ViT does not (supported: class, "
            "distillation and register tokens, class-token, average or class-token + average pooling, fc_norm, layer "
            "scale, qk-norm)")


def _check_strict(model: "VisionTransformer", state: dict[str, Any], where: Path, fmt: str) -> None:
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {expected[k]}"
                  for k in sorted(set(expected) & set(state)) if tuple(state[k].shape) != expected[k]]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}, vitdeploy naming): {shorten(missing)}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {shorten(unexpected)}")
        if mismatched:
            parts.append(f"shape mismatches ({len(mismatched)}): {shorten(mismatched, 5)}")
        raise CheckpointError(
            f"{where}: the {fmt} checkpoint does not fit a standard ViT (width {model.cfg.width}, depth "
            f"{model.cfg.depth}, heads {model.cfg.heads}, image {model.cfg.image_size}): " + "; ".join(parts)
            + ". " + _unsupported_parts(unexpected)
        )


# --------------------------------------------------------------------------- saving

def save_checkpoint(directory: str | os.PathLike, model: "VisionTransformer", labels: Iterable[str],
                    preprocess: PreprocessSpec | None, name: str) -> Path:
    """Write ``directory/model.safetensors`` then ``directory/model.json`` (each to a temp file in the
    same folder, then os.replace); returns the directory. ``load_checkpoint(directory)`` reads it back."""
    torch = require("torch", "saving checkpoints")
    save_file = require("safetensors.torch", "saving checkpoints").save_file
    cfg = model.cfg
    labels = tuple(str(x) for x in labels)
    if len(labels) != cfg.num_classes:
        raise CheckpointError(f"save_checkpoint: {len(labels)} labels for a head with {cfg.num_classes} classes; give one label per class")
    out = Path(directory).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    meta = {"format": OUR_FORMAT, "version": OUR_VERSION, "name": name, "vit": cfg.to_dict(), "labels": list(labels),
            "preprocess": preprocess.to_dict() if preprocess is not None else None}
    _atomic(out / OUR_WEIGHTS, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    _atomic(out / OUR_META, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8"))
    logger.info("saved vitdeploy checkpoint %s to %s", name, out)
    return out


def _atomic(target: Path, write) -> None:
    try:
        with atomic_path(target) as tmp:
            write(tmp)
    except OSError as exc:
        raise CheckpointError(f"{target}: cannot write ({exc})") from exc
