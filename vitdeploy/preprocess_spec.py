"""The preprocessing recipe that travels with a model (manifest, ONNX metadata, checkpoint).

Pure data, no image code, so configuration and checkpoint loading can build one without
importing Pillow or numpy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from numbers import Integral
from typing import Any

from .vocab import INTERPOLATIONS, PREPROCESS_STYLES, Interpolation
from .vocab import PreprocessStyle as Style

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class PreprocessSpec:
    """How pixels become the model's float32 NCHW input.

    style "hf":   resize straight to (height, width).
    style "timm": resize the shorter side to size / crop_pct, then centre-crop (height, width).
    Then scale to [0, 1], normalise by mean/std per channel.
    Transparent pixels are composited over ``background`` (RGB 0-255) before anything else.
    """

    style: Style = "hf"
    height: int = 224
    width: int = 224
    crop_pct: float = 0.875
    interpolation: Interpolation = "bilinear"
    mean: tuple[float, float, float] = INCEPTION_MEAN
    std: tuple[float, float, float] = INCEPTION_STD
    background: tuple[int, int, int] = field(default=(255, 255, 255))

    def __post_init__(self) -> None:
        if self.style not in PREPROCESS_STYLES:
            raise ValueError(f"preprocess style must be 'hf' or 'timm', got {self.style!r}")
        if self.height <= 0 or self.width <= 0:
            raise ValueError(f"preprocess size must be positive, got {self.height}x{self.width}")
        if not 0.0 < self.crop_pct <= 1.0:
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct}")
        if len(self.mean) != 3 or len(self.std) != 3 or any(s <= 0 for s in self.std):
            raise ValueError(f"mean/std must be 3 values with std > 0, got {self.mean} / {self.std}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"preprocess interpolation must be one of {', '.join(INTERPOLATIONS)}, "
                             f"got {self.interpolation!r}")
        bg = self.background
        if (not isinstance(bg, (tuple, list)) or len(bg) != 3
                or any(isinstance(v, bool) or not isinstance(v, Integral) or not 0 <= v <= 255 for v in bg)):
            raise ValueError(f"preprocess background must be 3 integers in 0..255 (an RGB colour), got {bg!r}")
        object.__setattr__(self, "background", tuple(int(v) for v in bg))  # a list or numpy ints -> plain tuple

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
