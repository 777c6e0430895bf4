"""The preprocessing recipe that travels with a model (manifest, ONNX metadata, checkpoint), defined once.

Pure data, no image code, so configuration and checkpoint loading can build one without
importing Pillow or numpy. :class:`PreprocessSpec` is the one definition of the recipe's fields:

* in Python, ``PreprocessSpec(...)`` checks it in ``__post_init__`` (``ValueError`` naming the field);
* manifest.json's ``preprocess`` is read by pydantic over the same class, with the strict types
  written on its fields (no "224" for 224, no 1.0 for a byte, unknown keys refused), then the same
  checks (``runtime/manifest_schema.py``);
* pipeline.yaml's ``preprocess:`` section is derived from it by :func:`overrides_model`: every field
  but the size, optional, None = the checkpoint's value (``config.PreprocessSection``).

Adding a field is adding one line here (type, default, description) and, if it changes pixels,
using it in ``runtime/preprocess.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from numbers import Integral
from typing import Annotated, Any, Optional, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, StrictInt, create_model
from pydantic.fields import FieldInfo

from ._schema import FiniteFloat, PositiveInt
from .vocab import CROP_MODES, INTERPOLATIONS, PREPROCESS_STYLES, CropMode, Interpolation
from .vocab import PreprocessStyle as Style

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)
#: OpenAI CLIP's normalisation (timm OPENAI_CLIP_MEAN / STD, open_clip OPENAI_DATASET_MEAN / STD)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

MAX_IMAGE_SIDE = 16384  # a ViT input side; 16k x 16k float32 is already 3 GB per image
Side = Annotated[PositiveInt, Field(le=MAX_IMAGE_SIDE)]
Byte = Annotated[StrictInt, Field(ge=0, le=255)]
Std = Annotated[FiniteFloat, Field(gt=0)]
#: Fields that are not pipeline.yaml overrides: the size is the model's image size.
_NOT_OVERRIDES = ("height", "width")


@dataclass(frozen=True)
class PreprocessSpec:
    """How pixels become the model's float32 NCHW input of (height, width).

    Each style is one library's geometry, reproduced exactly (Pillow resampling ``interpolation``):

    style "hf" (transformers' image processors, PIL backend): resize to
        (``resize_height``, ``resize_width``) ignoring the aspect ratio (None: straight to
        (height, width)), or, when ``shortest_edge`` is set, the shorter side to ``shortest_edge``
        (capped by ``longest_edge`` when set); then a centre crop of (height, width) at
        ``(size - crop) // 2`` (floored), zero pixels where the crop exceeds the image.
    style "timm" (``transforms_imagenet_eval``), scale size ``floor(size / crop_pct)``, by ``crop_mode``:
        "center": the shorter side to the scale size, centre crop;
        "squash": resize to the scale size ignoring the aspect ratio, centre crop;
        "border": the longer side to the scale size, centre crop or pad with ``round(255 * mean)``.
        Crop offsets ``round((size - crop) / 2)`` (torchvision's rule).
    style "torchvision" (the weights' ``ImageClassification`` transform): the shorter side to
        ``shortest_edge`` (torchvision's ``resize_size``), centre crop as torchvision (rounded).

    Then scale to [0, 1], normalise by mean/std per channel.
    Transparent pixels are composited over ``background`` (RGB 0-255) before anything else.
    """

    __pydantic_config__ = ConfigDict(extra="forbid")  # a manifest's unknown preprocess key is refused

    style: Annotated[Style, Field(description="whose geometry: hf (transformers), timm or torchvision")] = "hf"
    height: Side = 224
    width: Side = 224
    crop_pct: Annotated[FiniteFloat, Field(gt=0, le=1, description="timm style: crop / resize size")] = 0.875
    interpolation: Annotated[Interpolation, Field(description="Pillow resampling filter of the resize")] = "bilinear"
    mean: Annotated[
        tuple[FiniteFloat, FiniteFloat, FiniteFloat], Field(description="per-channel mean (RGB, 0-1 scale)")
    ] = INCEPTION_MEAN
    std: Annotated[tuple[Std, Std, Std], Field(description="per-channel standard deviation (RGB, > 0)")] = (
        INCEPTION_STD
    )
    background: Annotated[
        tuple[Byte, Byte, Byte], Field(description="RGB 0-255 colour transparent pixels are composited over")
    ] = field(default=(255, 255, 255))
    crop_mode: Annotated[CropMode, Field(description="timm style only")] = "center"
    resize_height: Annotated[Optional[Side], Field(description="hf style: resize to this height before the crop")] = (
        None
    )
    resize_width: Annotated[Optional[Side], Field(description="hf style: resize to this width before the crop")] = None
    shortest_edge: Annotated[
        Optional[Side], Field(description="hf / torchvision style: shorter side before the crop")
    ] = None
    longest_edge: Annotated[Optional[Side], Field(description="hf style: cap on the longer side")] = None

    def __post_init__(self) -> None:
        if self.style not in PREPROCESS_STYLES:
            raise ValueError(f"preprocess style must be one of {', '.join(PREPROCESS_STYLES)}, got {self.style!r}")
        if self.height <= 0 or self.width <= 0:
            raise ValueError(f"preprocess size must be positive, got {self.height}x{self.width}")
        if not 0.0 < self.crop_pct <= 1.0:
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct}")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {', '.join(CROP_MODES)}, got {self.crop_mode!r}")
        if len(self.mean) != 3 or len(self.std) != 3 or any(s <= 0 for s in self.std):
            raise ValueError(f"mean/std must be 3 values with std > 0, got {self.mean} / {self.std}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"preprocess interpolation must be one of {', '.join(INTERPOLATIONS)}, got {self.interpolation!r}"
            )
        bg = self.background
        if (
            not isinstance(bg, (tuple, list))
            or len(bg) != 3
            or any(isinstance(v, bool) or not isinstance(v, Integral) or not 0 <= v <= 255 for v in bg)
        ):
            raise ValueError(f"preprocess background must be 3 integers in 0..255 (an RGB colour), got {bg!r}")
        object.__setattr__(self, "background", tuple(int(v) for v in bg))  # a list or numpy ints -> plain tuple
        self._check_resize()

    def _check_resize(self) -> None:
        sizes = {
            "resize_height": self.resize_height,
            "resize_width": self.resize_width,
            "shortest_edge": self.shortest_edge,
            "longest_edge": self.longest_edge,
        }
        for key, value in sizes.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or value <= 0):
                raise ValueError(f"preprocess {key} must be a positive integer, got {value!r}")
        exact = (self.resize_height, self.resize_width)
        if (exact[0] is None) != (exact[1] is None):
            raise ValueError("preprocess resize_height and resize_width go together; set both or neither")
        if self.style == "hf" and self.shortest_edge is not None and exact[0] is not None:
            raise ValueError("preprocess: set either shortest_edge or resize_height/resize_width, not both")
        if self.style == "hf" and self.longest_edge is not None and self.shortest_edge is None:
            raise ValueError("preprocess longest_edge needs shortest_edge")
        if self.style == "torchvision":
            if self.shortest_edge is None:
                raise ValueError("preprocess style 'torchvision' needs shortest_edge (torchvision's resize_size)")
            if exact[0] is not None or self.longest_edge is not None:
                raise ValueError(
                    "preprocess style 'torchvision' takes shortest_edge only (no resize_height/width, longest_edge)"
                )
        if self.style == "timm" and any(v is not None for v in sizes.values()):
            raise ValueError(
                "preprocess style 'timm' derives its resize from crop_pct; unset resize_height, "
                "resize_width, shortest_edge and longest_edge"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean"], d["std"], d["background"] = list(self.mean), list(self.std), list(self.background)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PreprocessSpec":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown preprocess keys {sorted(unknown)}; allowed: {sorted(known)}")
        d = dict(data)
        for key in ("mean", "std"):
            if key in d:
                d[key] = tuple(float(v) for v in d[key])
        if "background" in d and isinstance(d["background"], (list, tuple)):
            d["background"] = tuple(d["background"])  # validated (ints 0..255, no silent rounding) in __post_init__
        return cls(**d)

    def replace(self, **changes: Any) -> "PreprocessSpec":
        return PreprocessSpec.from_dict({**self.to_dict(), **changes})

    def at_size(self, side: int) -> "PreprocessSpec":
        """The same recipe for a square input of ``side``: the sizes before the crop keep their ratio to the
        crop (timm's crop_pct does that by itself), as a checkpoint run at another size is preprocessed."""
        scale = side / self.height
        scaled = {
            k: int(round(getattr(self, k) * scale))
            for k in ("resize_height", "resize_width", "shortest_edge", "longest_edge")
            if getattr(self, k) is not None
        }
        return self.replace(height=side, width=side, **scaled)


#: pipeline.yaml keys that override the preprocessing (all under ``preprocess:``) and change the geometry
#: or the normalisation: every field but the size and the background.
OVERRIDE_KEYS: tuple[str, ...] = tuple(
    f.name for f in fields(PreprocessSpec) if f.name not in (*_NOT_OVERRIDES, "background")
)


def overrides_model(base: type[BaseModel], name: str = "PreprocessSection", doc: str = "") -> type[BaseModel]:
    """pipeline.yaml's ``preprocess:`` section, derived from :class:`PreprocessSpec`: the same fields
    (types, ceilings, descriptions) but the size, each optional with None = keep the checkpoint's;
    ``background`` keeps its default (a checkpoint does not state one)."""
    hints = get_type_hints(PreprocessSpec, include_extras=True)
    specs: dict[str, Any] = {}
    for f in fields(PreprocessSpec):
        if f.name in _NOT_OVERRIDES:
            continue
        description = FieldInfo.from_annotation(hints[f.name]).description
        if f.name == "background":
            specs[f.name] = (hints[f.name], Field(f.default, description=description))
        else:
            specs[f.name] = (Optional[hints[f.name]], Field(None, description=description))
    return create_model(name, __base__=base, __doc__=doc or None, __module__=base.__module__, **specs)
