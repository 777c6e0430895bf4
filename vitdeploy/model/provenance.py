"""Where each value of the model and its preprocessing came from, and what was assumed.

A checkpoint rarely says everything: a bare state dict carries no preprocessing and no head
count. Loaders fill the gaps with the convention of the library the checkpoint came from and
say so here, so `vitdeploy export` can print it and the manifest can record it.

Origins are short strings starting with one of :data:`ORIGINS` ("checkpoint: config.json",
"library default: timm pretrained_cfg of vit_tiny_patch16_224", "pipeline.yaml: preprocess.crop_pct").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.preprocess_spec import OVERRIDE_KEYS, PreprocessSpec  # noqa: F401 - OVERRIDE_KEYS re-exported

CHECKPOINT, LIBRARY, CONFIG = "checkpoint", "library default", "pipeline.yaml"
ORIGINS = (CHECKPOINT, LIBRARY, CONFIG)

_COMMON = ("style", "height", "width", "interpolation", "mean", "std")
#: The spec fields that change the pixels, per style (the others are unused by that style).
FIELDS_BY_STYLE = {
    "hf": (*_COMMON, "resize_height", "resize_width", "shortest_edge", "longest_edge"),
    "timm": (*_COMMON, "crop_pct", "crop_mode"),
    "torchvision": (*_COMMON, "shortest_edge"),
}


def relevant_fields(spec: PreprocessSpec) -> tuple[str, ...]:
    """The fields of ``spec`` its style uses; unset optional sizes left out."""
    return tuple(f for f in FIELDS_BY_STYLE[spec.style] if getattr(spec, f) is not None)


@dataclass(frozen=True)
class Preprocessing:
    """A spec with the origin of each field and the assumptions made to get it."""

    spec: PreprocessSpec
    origins: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @classmethod
    def from_source(
        cls, spec: PreprocessSpec, origin: str, exceptions: dict[str, str] | None = None, notes: tuple[str, ...] = ()
    ) -> "Preprocessing":
        """Every relevant field from ``origin`` except those in ``exceptions`` (field -> origin)."""
        exceptions = exceptions or {}
        origins = {f: exceptions.get(f, origin) for f in relevant_fields(spec)}
        return cls(spec, origins, notes)


def override_hint() -> str:
    return "override in pipeline.yaml under preprocess: (" + ", ".join(OVERRIDE_KEYS) + ")"


def describe_spec(spec: PreprocessSpec) -> str:
    """One line a person reads: what happens to an image."""
    size = f"{spec.height}x{spec.width}" if spec.height != spec.width else str(spec.height)
    if spec.style == "hf":
        if spec.shortest_edge is not None:
            resize = f"shorter side to {spec.shortest_edge}" + (
                f" (longer at most {spec.longest_edge})" if spec.longest_edge else ""
            )
        elif spec.resize_height is not None:
            resize = f"resize to {spec.resize_height}x{spec.resize_width} (aspect ratio not kept)"
        else:
            resize = f"resize to {spec.height}x{spec.width} (aspect ratio not kept)"
        crop = (
            ""
            if (spec.resize_height is None and spec.shortest_edge is None)
            else f", centre crop {size} (floored offset)"
        )
    elif spec.style == "torchvision":
        resize, crop = f"shorter side to {spec.shortest_edge}", f", centre crop {size}"
    else:
        scale = int(spec.height / spec.crop_pct) if spec.height == spec.width else f"{spec.height}/{spec.crop_pct:g}"
        resize = {
            "center": f"shorter side to {scale}",
            "squash": f"resize to {scale}x{scale} (aspect ratio not kept)",
            "border": f"longer side to {scale}, pad with the mean colour",
        }[spec.crop_mode]
        crop = f", centre crop {size} (crop_pct {spec.crop_pct:g}, crop_mode {spec.crop_mode})"
    mean = ", ".join(f"{v:g}" for v in spec.mean)
    std = ", ".join(f"{v:g}" for v in spec.std)
    return f"{spec.style} style: {resize}, {spec.interpolation}{crop}; mean ({mean}), std ({std})"
