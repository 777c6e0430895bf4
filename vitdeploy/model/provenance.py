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


# --------------------------------------------------------------------------- which library's preprocessing

#: transformers 5 has two image processors per model: the PIL one ("...Pil"), which vitdeploy mirrors, and
#: the torchvision-based one ("fast"), its default where torchvision is installed. How far apart they are,
#: measured by tests/model/test_checkpoints_processors.py on photos and on transparent images.
#: max |fast - PIL| in uint8 levels on photos and transparent images, per processor (transformers 5.24, torchvision
#: 0.29): the torchvision resize rounds differently from PIL's, more for a bicubic squash to 256x256 (DeiT)
FAST_PROCESSOR_LEVELS = {"ViTImageProcessor": 1, "BitImageProcessor": 1, "DeiTImageProcessor": 6}


def fast_processor_differs(kind: str) -> str:
    """What the fast twin of processor ``kind`` does to the pixels, against the PIL one mirrored here."""
    levels = FAST_PROCESSOR_LEVELS.get(kind)
    measured = (
        f"by at most {levels} uint8 level{'s' if levels != 1 else ''} (measured on photos and transparent images)"
        if levels is not None
        else "by a rounding of the resize (not measured for this processor)"
    )
    return (
        f"transformers' default where torchvision is installed; its pixels differ from the PIL processor's "
        f"(mirrored here) {measured}, never in geometry"
    )


TRANSPARENCY_CONVERTED = (
    "transparent pixels composited over preprocess.background (white), as transformers' convert_to_rgb does in "
    "both processors"
)
TRANSPARENCY_REFUSED = (
    "transformers' processors (both) refuse a transparent image here (do_convert_rgb unset): vitdeploy composites "
    "it over preprocess.background (white), as transformers does where do_convert_rgb is set; convert images to "
    "RGB yourself to get another result"
)


def installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` installed here (its metadata, without importing it), None when absent."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def mirror_record(library: str, **fields: object) -> dict[str, object]:
    """What the preprocessing mirrors: the library, the version installed here (None: not installed; the
    mirror was tested against the versions in the project's test environments), and how (``fields``)."""
    return {"library": library, "version": installed_version(library), **fields}
