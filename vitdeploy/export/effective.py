"""What an export will actually use: the checkpoint as understood, and the effective preprocessing
with the origin of every value (checkpoint / library default / pipeline.yaml).

``vitdeploy export`` prints :func:`describe` at default verbosity and records the same origins in
the manifest; ``vitdeploy config check`` prints it for the configured checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base.config import PipelineConfig
from ..base.errors import ConfigError
from ..base.preprocess_spec import PreprocessSpec
from ..demo import DEMO_DIR as DEMO_MODEL_DIR

_STYLE_SIZES = ("resize_height", "resize_width", "shortest_edge", "longest_edge")


@dataclass(frozen=True)
class Effective:
    """The loaded checkpoint, the preprocessing the export uses and where each of its values came from."""

    loaded: Any  # model.LoadedCheckpoint
    spec: PreprocessSpec
    origins: dict[str, str]

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self.loaded.notes)

    def config_dump(self, cfg: PipelineConfig) -> dict[str, Any]:
        """pipeline.yaml's effective values: the ``preprocess`` section as export will use it (no nulls)."""
        data = cfg.model_dump(mode="json", exclude={"source"})
        data["preprocess"] = {k: v for k, v in self.spec.to_dict().items() if v is not None}
        data["preprocess_origins"] = dict(self.origins)
        return data

    def model_record(self, cfg: PipelineConfig) -> dict[str, Any]:
        """The ``model.source`` entry of manifest.json (with ``hub``: repo, revision, commit, files' sha256)."""
        ld, vit = self.loaded, self.loaded.config
        hub = {"hub": ld.hub.record()} if ld.hub is not None else {}
        return {
            "path": ld.hub.pinned if ld.hub is not None else str(cfg.checkpoint_ref or "demo"),
            "format": ld.source_format,
            "heads_origin": ld.heads_origin,
            "native_image_size": ld.native_image_size or vit.image_size,
            "resampled_pos_embed": bool(
                ld.native_image_size and ld.native_image_size != vit.image_size and not vit.dynamic_size
            ),
            "notes": list(ld.notes),
            **hub,
        }

    def preprocess_reference(self) -> dict[str, Any]:
        """Which library's preprocessing this export mirrors (manifest ``preprocess_reference``), and the
        pipeline.yaml keys that override it."""
        from ..model.provenance import CONFIG

        overridden = sorted(k for k, origin in self.origins.items() if origin.startswith(CONFIG))
        return {**self.loaded.preprocess_reference, **({"overridden": overridden} if overridden else {})}


def load_model(cfg: PipelineConfig) -> Any:
    """The checkpoint named in the config (absent = the embedded demo model)."""
    from ..model.checkpoints import load_checkpoint

    m = cfg.model
    path = cfg.checkpoint_ref or DEMO_MODEL_DIR  # an existing path or a Hub name (fetched, then read as a folder)
    return load_checkpoint(
        path,
        image_size=m.image_size,
        variant=m.variant,
        num_heads=m.num_heads,
        act=m.activation,
        layer_norm_eps=m.layer_norm_eps,
        pool=m.pool,
        image_sizes=tuple(cfg.export.image_sizes or ()),
    )


def resolve_preprocess(cfg: PipelineConfig, loaded: Any) -> tuple[PreprocessSpec, dict[str, str]]:
    """The checkpoint's preprocessing (or its library's convention) with the ``preprocess:`` keys of
    pipeline.yaml that are set laid over it; and the origin of each value that changes the pixels."""
    from ..model.provenance import CONFIG, LIBRARY, relevant_fields

    size = loaded.config.image_size
    spec = loaded.preprocess
    origins = dict(loaded.preprocess_origins)
    if spec is None:  # a vitdeploy checkpoint saved without preprocessing
        spec = PreprocessSpec(style="hf", height=size, width=size)
        origins = {}
    fallback = f"{LIBRARY}: vitdeploy PreprocessSpec"
    overrides = {k: v for k, v in cfg.preprocess.model_dump().items() if v is not None}
    if overrides.get("style", spec.style) != spec.style:  # another library's geometry: its own sizes only
        overrides = {**{k: None for k in _STYLE_SIZES}, **overrides}
    if spec.height != size or spec.width != size:
        origins.update(height=f"{LIBRARY}: the model's image size", width=f"{LIBRARY}: the model's image size")
    try:
        spec = spec.replace(**overrides, height=size, width=size)
    except ValueError as exc:
        raise ConfigError(f"{cfg.source or 'pipeline config'}: preprocess: {exc}") from None
    for key, value in overrides.items():
        if value is not None or key in cfg.preprocess.model_fields_set:
            origins[key] = f"{CONFIG}: preprocess.{key}"
    return spec, {f: origins.get(f, fallback) for f in relevant_fields(spec)}


def resolve(cfg: PipelineConfig) -> Effective:
    """Load the configured checkpoint and resolve its effective preprocessing."""
    loaded = load_model(cfg)
    spec, origins = resolve_preprocess(cfg, loaded)
    return Effective(loaded, spec, origins)


def _output_line(vit: Any, cfg: PipelineConfig) -> str:
    """What the export returns (model.output against the checkpoint: ConfigError when it cannot be had)."""
    from ..base.output_spec import resolve_output

    if getattr(vit, "head_l2norm", False):  # baked (model/zero_shot.py): the text tower's classes are the head
        return f"output: logits, {vit.num_classes} zero-shot classes (scale x cosine with each class's prompts)"
    if cfg.model.zero_shot is not None:  # before the export has run the text tower (`config check`)
        return "output: logits, a zero-shot classifier (the class prompts embedded by the text tower at export)"

    output = resolve_output(
        cfg.model.output,
        cfg.model.normalize,
        vit.num_classes,
        cfg.checkpoint_ref or "the demo",
        cfg.model.patch_tokens,
    )
    if not output.is_embedding:
        return f"output: logits, {vit.num_classes} classes"
    pooled = "attention pooling: a probe over the patch tokens, then its norm and MLP" if vit.pool == "map" else ""
    pooled = pooled or f"{vit.pool} pooling" + (", then the pooler: dense + tanh, pooler_output" if vit.pooler else "")
    normalized = ", L2-normalised" if output.normalize else ""
    tokens = f"; PATCH_TOKENS [{vit.num_patches}, {vit.width}] beside it" if output.patch_tokens else ""
    return f"output: embedding, {vit.pooled_width} floats per image ({pooled}{normalized}); no labels{tokens}"


def describe(eff: Effective, cfg: PipelineConfig) -> list[str]:
    """Lines for a person: the model understood, the preprocessing and each value's origin, the assumptions."""
    from ..model.formats.shared import SIZE_BY_WIDTH
    from ..model.provenance import describe_spec

    ld, vit = eff.loaded, eff.loaded.config
    source = _source_text(ld) if ld.hub is not None else cfg.checkpoint_ref or "the built-in demo model"
    kind = {
        "vitdeploy": "vitdeploy checkpoint",
        "hf": "Hugging Face ViT",
        "timm": "timm ViT",
        "torchvision": "torchvision ViT",
    }.get(ld.source_format, ld.source_format)
    size = SIZE_BY_WIDTH.get(vit.width)
    standard = f"vit_{size}_patch{vit.patch_size} dims, " if size and vit.depth in (12, 24, 32, 40) else ""
    mlp = f"SwiGLU MLP {vit.mlp_dim}" if vit.mlp == "swiglu" else f"MLP {vit.mlp_dim}, activation {vit.act}"
    lines = [
        f"model: {kind} from {source}",
        f"  {standard}width {vit.width}, depth {vit.depth}, {vit.heads} heads, {mlp}, "
        f"image {vit.image_size}, patch {vit.patch_size}, {vit.num_classes} classes",
    ]
    family = vit.family_summary()
    if family:
        lines.append(f"  {family}")
    lines.append(f"  {_output_line(vit, cfg)}")
    if ld.heads_origin:
        lines.append(f"  heads from {ld.heads_origin}")
    native = ld.native_image_size or vit.image_size
    if vit.dynamic_size:
        g0 = vit.pos_grid
        how = "bicubic, antialiased" if vit.pos_resample == "bicubic_antialias" else "bicubic"
        sizes = ", ".join(map(str, cfg.export.image_sizes or ()))
        lines.append(f"  image sizes {sizes}: the {g0}x{g0} position table resampled per input ({how})")
    elif native != vit.image_size:
        g0, g1 = native // vit.patch_size, vit.grid
        lines.append(f"  position embeddings resampled {g0}x{g0} -> {g1}x{g1} (model.image_size {vit.image_size})")
    lines.append(f"preprocess: {describe_spec(eff.spec)}")
    width = max((len(k) for k in eff.origins), default=0)
    for key, origin in eff.origins.items():
        value = getattr(eff.spec, key)
        shown = ", ".join(f"{v:g}" for v in value) if isinstance(value, tuple) else value
        lines.append(f"  {key:<{width}}  {shown!s:<22} {origin}")
    mirrors = _mirrors_text(eff.preprocess_reference())
    if mirrors:
        lines.append(f"  mirrors {mirrors}")
    lines.extend(f"note: {n}" for n in eff.notes)
    return lines


def _source_text(loaded: Any) -> str:
    """``org/name@rev (commit abc123def456, 3 files, from https://huggingface.co)``."""
    hub = loaded.hub
    asked = f"@{hub.name.revision}" if hub.name.revision else ""
    cached = ", from the cache (HF_HUB_OFFLINE)" if hub.offline else f", from {hub.endpoint}"
    return f"{hub.name.repo_id}{asked} (commit {hub.commit}, {len(hub.files)} files{cached})"


def _mirrors_text(reference: dict[str, Any]) -> str:
    """``transformers 5.24.0 ViTImageProcessorPil`` (what the preprocessing mirrors), or "" for vitdeploy's own."""
    library = reference.get("library")
    if not library or library == "vitdeploy":
        return ""
    how = reference.get("processor") or reference.get("transform") or ""
    version = reference.get("version") or "not installed here"
    overridden = reference.get("overridden")
    return f"{library} ({version}) {how}".rstrip() + (f", except {', '.join(overridden)}" if overridden else "")
