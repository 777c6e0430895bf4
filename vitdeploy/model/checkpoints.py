"""Load a ViT checkpoint of any supported format into :class:`VisionTransformer`; save our own format.

Formats are recognised from the contents of the file or directory, not its name, each by its reader
(``model/formats/``: one place per format, one registry line; ``formats/resolve.py`` detects):

* ``vitdeploy``: a directory with ``model.json`` (``"format": "vitdeploy"``) and ``model.safetensors``,
  or either file inside it.
* ``hf``: a Hugging Face ``ViTForImageClassification`` / ``ViTModel`` / DeiT / DINOv2 / CLIP / SigLIP image tower
  directory (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``, sharded or not), or a weights file
  inside it.
* ``timm``: a timm ``vision_transformer`` state dict (.safetensors or a torch.save file), or a timm hub
  directory (``config.json`` with ``architecture``).
* ``open_clip``: an OpenCLIP folder (``open_clip_config.json`` + ``open_clip_model.safetensors`` /
  ``open_clip_pytorch_model.bin``) or state dict: its image tower.
* ``torchvision``: a torchvision ``vit_*`` state dict.

Loading is strict: every parameter of the model must come from the checkpoint with the right shape
and nothing may be left over, otherwise :class:`CheckpointError` lists what does not fit.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Union

from ..base._deps import require
from ..base._files import atomic_path
from ..base.errors import CheckpointError, WriteError
from ..base.hub_name import HUB_PREFIX, HubName, parse_hub_name
from ..base.preprocess_spec import PreprocessSpec
from ..base.vocab import CHECKPOINT_CONFIG, CHECKPOINT_WEIGHTS
from .config_schema import check_checkpoint_config
from .formats import LoadOptions, Source, reader_for
from .formats.resolve import resolve_source
from .formats.shared import read_state_dict, shorten, to_float32
from .formats.vitdeploy import FORMAT as OUR_FORMAT
from .formats.vitdeploy import VERSION as OUR_VERSION
from .provenance import CONFIG, Preprocessing

if TYPE_CHECKING:  # pragma: no cover
    from .hub import HubSnapshot
    from .vit import VisionTransformer, ViTConfig

logger = logging.getLogger(__name__)

OUR_WEIGHTS, OUR_META = CHECKPOINT_WEIGHTS, CHECKPOINT_CONFIG
_Source = Source  # the name before the readers (private; kept for one release)


@dataclass(frozen=True)
class LoadedCheckpoint:
    model: "VisionTransformer"  # eval(), float32, weights loaded strictly
    config: "ViTConfig"
    labels: tuple[str, ...]
    preprocess: PreprocessSpec | None  # None only for a vitdeploy checkpoint saved without one
    source_format: str  # "vitdeploy" | "timm" | "hf" | "open_clip" | "torchvision" (formats.FORMATS)
    name: str
    # Where each relevant preprocess field came from ("checkpoint: ...", "library default: ...", "pipeline.yaml: ...").
    preprocess_origins: dict[str, str] = field(default_factory=dict)
    heads_origin: str = ""
    native_image_size: int = 0  # the checkpoint's own image size (differs when position embeddings were resampled)
    notes: tuple[str, ...] = ()  # assumptions made for what the checkpoint does not say, each with its override
    hub: Optional["HubSnapshot"] = None  # where a Hub checkpoint came from (repo, revision, commit, files' sha256)
    # Which library's preprocessing the spec mirrors (its processor or transform, the version installed here).
    preprocess_reference: dict[str, Any] = field(default_factory=dict)


def detect_format(path: str | os.PathLike) -> str:
    """ "vitdeploy", "timm", "hf" or "torchvision", from the contents; CheckpointError otherwise."""
    return resolve_source(Path(path)).format


def load_checkpoint(
    path: Union[str, os.PathLike, HubName],
    *,
    revision: str | None = None,
    image_size: int | None = None,
    num_classes: int | None = None,
    variant: str | None = None,
    num_heads: int | None = None,
    act: str | None = None,
    layer_norm_eps: float | None = None,
    pool: str | None = None,
    image_sizes: tuple[int, ...] = (),
) -> LoadedCheckpoint:
    """Load ``path`` strictly into a float32 VisionTransformer in eval mode.

    path: a checkpoint file or folder, or a Hugging Face Hub name (``org/name``, ``org/name@rev``,
        ``hf-hub:org/name``; a path that exists always wins), fetched through huggingface_hub's cache
        (``model/hub``) at one commit, recorded in the result's ``hub``. revision: the Hub revision.

    image_size: build the model for this input size; learned position embeddings are resampled
        (bicubic) from the checkpoint's grid, and the preprocessing size follows. Without it a Hugging
        Face DINOv2 model is built for its processor's crop (transformers resamples to its input).
    num_classes: a check, not a head reset: CheckpointError unless the checkpoint's head has exactly
        this many outputs (0 = features only).
    variant: heads for formats that do not store them (timm, torchvision), e.g. 'vit_base_patch16_224';
        checked against the tensors and, for hf / vitdeploy, against the stored config.
    num_heads / act ("gelu" | "gelu_tanh" | "quick_gelu") / layer_norm_eps: what a bare state dict cannot say
        (pipeline.yaml model.num_heads / model.activation / model.layer_norm_eps); where the checkpoint
        stores them, a different value is an error.
    pool ("token" | "avg" | "token_avg"): the pooling of a timm state dict without config.json (pipeline.yaml
        model.pool); checked against the pooling other checkpoints state.
    image_sizes: the sizes one export answers at (export.image_sizes): the network keeps the checkpoint's own
        position table and resamples it to each input's grid at every call, as its library does
        (``ViTConfig.pos_resample``); ``image_size`` (or the size the library runs at) is the base size.
        CheckpointError for a checkpoint whose library runs it at one size only, or a size off the patch.
    What was assumed is in the result's ``notes``; where each value came from in its origins.
    The format's reader (``model/formats/<format>``) does every format-specific step, in the same order for all.
    """
    hub = _hub_name(path, revision)
    if hub is not None:
        from .hub import fetch

        snapshot = fetch(hub)
        try:
            loaded = _load(
                snapshot.folder, image_size, num_classes, variant, num_heads, act, layer_norm_eps, pool, image_sizes
            )
        except CheckpointError as exc:
            raise CheckpointError(f"{snapshot.pinned}: {exc}") from exc
        name = hub.short_name if loaded.name == snapshot.folder.name else loaded.name  # not the commit's folder
        return replace(loaded, hub=snapshot, name=name)
    return _load(Path(path), image_size, num_classes, variant, num_heads, act, layer_norm_eps, pool, image_sizes)


def _hub_name(path: Union[str, os.PathLike, HubName], revision: str | None) -> HubName | None:
    """The Hub name ``path`` spells, when it is not a path that exists."""
    if isinstance(path, HubName):
        return HubName(path.repo_id, path.revision or revision)
    text = os.fspath(path)
    if Path(text).expanduser().exists() and not text.startswith(HUB_PREFIX):
        if revision is not None:
            raise CheckpointError(f"{text}: a local path; a revision ({revision}) applies to a Hub name (org/name)")
        return None
    return parse_hub_name(text, revision, key="checkpoint")


def _load(
    path: Path,
    image_size: int | None,
    num_classes: int | None,
    variant: str | None,
    num_heads: int | None,
    act: str | None,
    layer_norm_eps: float | None,
    pool: str | None,
    image_sizes: tuple[int, ...] = (),
) -> LoadedCheckpoint:
    """The body of load_checkpoint for a path (every format's reader called in the same order)."""
    src = resolve_source(path)
    reader = reader_for(src.format)
    opts = LoadOptions(variant=variant, num_heads=num_heads, act=act, layer_norm_eps=layer_norm_eps, pool=pool)
    check_checkpoint_config(src.format, src.meta, src.meta_dir)  # every stated value, before any use
    where = src.where
    state = to_float32(src.state if src.state is not None else _read_all(src.weights))
    state = reader.convert_keys(state)
    read = reader.config(src, state, opts)
    cfg = read.config
    _check_stored(cfg, where, **{k: getattr(opts, k) for k in reader.stores})
    labels = reader.labels(src, cfg)
    pre = reader.preprocess(src, cfg, opts)
    if num_classes is not None and num_classes != cfg.num_classes:
        raise CheckpointError(
            f"{where}: the checkpoint's head has {cfg.num_classes} classes but num_classes={num_classes} was "
            "asked for; vitdeploy does not silently reset a head. Drop num_classes, or fine-tune and save a "
            "checkpoint with the head you need"
        )
    native = cfg.image_size
    follow = reader.native_input(src, cfg, pre) if image_size is None else None
    antialias = reader.antialias(src)
    notes = list(pre.notes if pre else ()) + list(read.notes)
    if image_sizes:
        rule = reader.pos_resample(src, cfg)
        cfg, pre, note = _any_size(cfg, pre, rule, image_size or follow, tuple(image_sizes), where, src.format)
        notes.append(note)
    elif follow is not None:  # the size the source library runs at, not its config's
        cfg, state, _ = _resize(cfg, state, None, follow, where, antialias=antialias)
        notes.append(
            f"{where.name}: runs at the processor's {follow}x{follow} crop, not config.json's image_size "
            f"{native}: the position table is resampled once (bicubic{', antialiased' if antialias else ''}) "
            "as transformers resamples it at every call; model.image_size sets another size"
        )
    elif image_size is not None and image_size != cfg.image_size:
        cfg, state, pre = _resize(cfg, state, pre, image_size, where, antialias=antialias)

    model = _build_and_load(cfg, state, where, src.format)
    if labels is None:
        labels = tuple(f"class_{i}" for i in range(cfg.num_classes))
    if read.heads_origin.startswith("library default (assumed)"):
        notes.insert(0, f"{where.name}: assumed {cfg.heads} attention heads: {read.heads_origin.split(': ', 1)[1]}")
    logger.info("loaded %s checkpoint %s: %s", src.format, where, cfg)
    return LoadedCheckpoint(
        model=model,
        config=cfg,
        labels=labels,
        preprocess=pre.spec if pre else None,
        source_format=src.format,
        name=src.name,
        preprocess_origins=dict(pre.origins) if pre else {},
        heads_origin=read.heads_origin,
        native_image_size=native,
        notes=tuple(notes),
        preprocess_reference=reader.reference(src),
    )


def _check_stored(cfg: "ViTConfig", where: Path, **given: Any) -> None:
    """A value given for what the checkpoint stores must agree with it."""
    stored = {"num_heads": cfg.heads, "act": cfg.act, "layer_norm_eps": cfg.layer_norm_eps, "pool": cfg.pool}
    keys = {
        "num_heads": "model.num_heads",
        "act": "model.activation",
        "layer_norm_eps": "model.layer_norm_eps",
        "pool": "model.pool",
    }
    for name, value in given.items():
        if value is not None and value != stored[name]:
            raise CheckpointError(
                f"{where}: {keys[name]} is {value!r} but the checkpoint stores {stored[name]!r}; "
                f"drop {keys[name]} (it is only needed for checkpoints that do not store it)"
            )


def _read_all(files: Iterable[Path]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for f in files:
        part = read_state_dict(f)
        clash = set(part) & set(state)
        if clash:
            raise CheckpointError(f"{f}: tensors {shorten(clash)} also appear in another shard")
        state.update(part)
    return state


def _resize(
    cfg: "ViTConfig",
    state: dict[str, Any],
    pre: Preprocessing | None,
    image_size: int,
    where: Path,
    antialias: bool = True,
) -> tuple["ViTConfig", dict[str, Any], Preprocessing | None]:
    from .vit import resample_pos_embed

    if image_size <= 0 or image_size % cfg.patch_size:
        raise CheckpointError(
            f"{where}: image_size {image_size} is not a positive multiple of the patch size {cfg.patch_size}"
        )
    new_cfg = cfg.replace(image_size=image_size)
    pos = state.get("pos_embed")
    if cfg.pos_embed == "learned" and pos is not None and pos.ndim == 3 and pos.shape[1] == cfg.pos_len:
        state = {
            **state,
            "pos_embed": resample_pos_embed(pos, new_cfg.grid, cfg.pos_len - cfg.num_patches, antialias=antialias),
        }
        logger.info(
            "%s: resampled position embeddings from %dx%d to %dx%d",
            where,
            cfg.grid,
            cfg.grid,
            new_cfg.grid,
            new_cfg.grid,
        )
    return new_cfg, state, _preprocess_at(pre, image_size)


def _any_size(
    cfg: "ViTConfig",
    pre: Preprocessing | None,
    rule: str | None,
    base: int | None,
    sizes: tuple[int, ...],
    where: Path,
    fmt: str,
) -> tuple["ViTConfig", Preprocessing | None, str]:
    """The config of a network that runs at every size of ``sizes``: its own table, resampled per call."""
    patch, table = cfg.patch_size, cfg.pos_size or cfg.image_size
    if rule is None or cfg.pos_embed != "learned":
        why = "its library runs it" if rule is None else "its fixed sine-cosine table is made for"
        raise CheckpointError(
            f"{where}: export.image_sizes: the {fmt} checkpoint runs at {cfg.image_size}x{cfg.image_size} only "
            f"({why} one size); drop export.image_sizes (model.image_size picks that one size)"
        )
    bad = [s for s in sizes if s % patch]
    if bad:
        raise CheckpointError(
            f"{where}: export.image_sizes {', '.join(map(str, bad))} not a multiple of the patch size {patch}; "
            f"sizes that work are multiples of {patch}, e.g. {', '.join(str(patch * k) for k in (16, 24, 32))}"
        )
    base = base or cfg.image_size
    if base not in sizes:
        base = min(sizes)
    new = cfg.replace(image_size=base, pos_size=0 if table == base else table, pos_resample=rule)
    how = "bicubic, antialiased" if rule == "bicubic_antialias" else "bicubic"
    note = (
        f"{where.name}: answers at {', '.join(map(str, sorted(sizes)))} px (base {base}): the {table // patch}x"
        f"{table // patch} position table is resampled to each input's grid at every call ({how}), as its library "
        "does"
    )
    return new, _preprocess_at(pre, base), note


def _preprocess_at(pre: Preprocessing | None, image_size: int) -> Preprocessing | None:
    """The checkpoint's preprocessing for another input size (PreprocessSpec.at_size: the ratio kept)."""
    if pre is None or (pre.spec.height, pre.spec.width) == (image_size, image_size):
        return pre
    spec = pre.spec.at_size(image_size)
    changed = [k for k, v in spec.to_dict().items() if v != getattr(pre.spec, k)]
    origins = {**pre.origins, **{k: f"{CONFIG}: model.image_size" for k in changed}}
    return Preprocessing(spec, origins, pre.notes)


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
_UNSUPPORTED_PARTS = {
    "head.fc.": "a pre-logits layer",
    "pre_logits.": "a pre-logits layer",
    ".attn.gate.": "gated attention",
    "mask_token": "a mask token",
    ".mlp.w12.": "a gated MLP in DINOv2's original naming (w12 / w3; timm's SwiGLUPacked names, fc1 / fc2, load)",
}


def _unsupported_parts(unexpected: list[str]) -> str:
    """The sentence naming what the leftover keys are, where we know."""
    found = sorted({what for key in unexpected for frag, what in _UNSUPPORTED_PARTS.items() if frag in key})
    if found:
        return "The model has parts vitdeploy's ViT does not: " + ", ".join(found)
    return (
        "The file is incomplete or edited, or the model has parts vitdeploy's ViT does not (supported: class, "
        "distillation and register tokens, class-token, average, class-token + average or SigLIP's attention pooling, "
        "fc_norm, layer scale, qk-norm, CLIP's norm before the blocks and projection, EVA-02's rotary attention, "
        "norms inside the MLP and on the attention output)"
    )


def _check_strict(model: "VisionTransformer", state: dict[str, Any], where: Path, fmt: str) -> None:
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {expected[k]}"
        for k in sorted(set(expected) & set(state))
        if tuple(state[k].shape) != expected[k]
    ]
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
            f"{model.cfg.depth}, heads {model.cfg.heads}, image {model.cfg.image_size}): "
            + "; ".join(parts)
            + ". "
            + _unsupported_parts(unexpected)
        )


# --------------------------------------------------------------------------- saving


def save_checkpoint(
    directory: str | os.PathLike,
    model: "VisionTransformer",
    labels: Iterable[str],
    preprocess: PreprocessSpec | None,
    name: str,
    output: Any = None,
) -> Path:
    """Write ``directory/model.safetensors`` then ``directory/model.json`` (each to a temp file in the
    same folder, then os.replace); returns the directory. ``load_checkpoint(directory)`` reads it back.
    ``output`` (base/output_spec.ModelOutput): what the export's network returns, for the torch backend."""
    torch = require("torch", "saving checkpoints")
    save_file = require("safetensors.torch", "saving checkpoints").save_file
    cfg = model.cfg
    labels = tuple(str(x) for x in labels)
    if len(labels) != cfg.num_classes:
        raise CheckpointError(
            f"save_checkpoint: {len(labels)} labels for a head with {cfg.num_classes} classes; give one label per "
            "class"
        )
    out = Path(directory).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    meta = {
        "format": OUR_FORMAT,
        "version": OUR_VERSION,
        "name": name,
        "vit": cfg.to_dict(),
        "labels": list(labels),
        "preprocess": preprocess.to_dict() if preprocess is not None else None,
        **({"output": output.to_dict()} if output is not None else {}),
    }
    _atomic(out / OUR_WEIGHTS, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    _atomic(out / OUR_META, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8"))
    logger.info("saved vitdeploy checkpoint %s to %s", name, out)
    return out


def _atomic(target: Path, write) -> None:
    try:
        with atomic_path(target) as tmp:
            write(tmp)
    except OSError as exc:
        if exc.errno in WriteError.ERRNOS:
            raise WriteError.from_os(exc, target) from exc
        raise CheckpointError(f"{target}: cannot write ({exc})") from exc
    except Exception as exc:  # safetensors reports an I/O error as its own type, "... (os error 27)"
        found = re.search(r"\(os error (\d+)\)", str(exc))
        if found is None:
            raise
        code = int(found.group(1))
        raise WriteError.from_os(OSError(code, os.strerror(code)), target) from exc
