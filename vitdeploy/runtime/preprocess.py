"""The one preprocessing of vitdeploy: image -> float32 CHW tensor, for every backend.

Export validation, ``predict``, ``validate``, ``bench`` and the tests all call
:class:`Preprocessor`, so the tensor a deployment sees is bit-for-bit the tensor validation saw.
numpy + Pillow only (no torch): the ONNX Runtime deployment runs without it.

Pipeline (:func:`~vitdeploy.runtime.images.load_image` does steps 1-3):

1. decode (only the formats in ``SUPPORTED_FORMATS``; decompression bombs refused before
   decoding), first frame of animations;
2. EXIF orientation applied;
3. any mode to RGB, transparency composited over ``spec.background`` (greyscale without
   transparency stays one channel through the resize and is broadcast to R = G = B at the
   end: the same numbers as converting first, at a third of the resampling cost);
4. geometry, with Pillow's resampling filter ``spec.interpolation``, as the library the spec
   names does it (:func:`resize_plan`; the styles are described on
   :class:`~vitdeploy.base.preprocess_spec.PreprocessSpec`):

   * ``style="hf"`` (transformers' image processors, PIL backend): resize to a fixed size or
     by ``shortest_edge`` (+ ``longest_edge``), then centre crop at the floored offset
     ``(size - crop) // 2``, zero-padded where the image is smaller;
   * ``style="timm"`` (timm ``transforms_imagenet_eval``): scale size
     ``floor(size / crop_pct)``; ``crop_mode`` "center" resizes the shorter side to it (square
     target: torchvision ``Resize(int)``, longer side ``int(size * long / short)``; non-square
     target: timm's ``ResizeKeepRatio``), "squash" resizes to it ignoring the aspect ratio,
     "border" fits the longer side and pads with ``round(255 * mean)``; centre crop at
     ``round((size - crop) / 2)`` (Python's round, as torchvision's ``center_crop``);
   * ``style="torchvision"`` (the weights' ``ImageClassification``): the shorter side to
     ``shortest_edge``, centre crop as above.

   Where the full intermediate would exceed :data:`MAX_INTERMEDIATE_PIXELS` (4 Mpx: aspect
   ratios beyond ~64:1 at 224) only the band kept by the crop is resampled, which may differ
   from the full resize by one 8-bit level (one source pixel for "nearest"/"box"), so a
   1 x 10000 image stays cheap. Below that limit the result is bit-identical to the library's
   full resize then crop.

5. normalise: ``(x / 255 - mean) / std`` computed as one multiply-add per element with
   precomputed float32 ``scale = 1 / (255 * std)`` and ``offset = -mean / std``; output
   float32, CHW (``(N, 3, H, W)`` for batches).

No ``Image.draft()`` (JPEG DCT-domain downscaling) and no ``reducing_gap``: both change the
pixels compared with the references (transformers, timm), which this module matches exactly.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from PIL import Image

from ..base.errors import InputError
from ..base.preprocess_spec import PreprocessSpec
from .images import MAX_IMAGE_PIXELS, ImageSource, load_image

log = logging.getLogger(__name__)

#: Above this many pixels the timm-style resize is done only over the crop (see module doc).
MAX_INTERMEDIATE_PIXELS = 1 << 22

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


class Preprocessor:
    """Turns images into the model's float32 input according to a :class:`PreprocessSpec`.

    ``max_pixels`` is the decompression-bomb limit passed to :func:`load_image` (``None`` turns
    vitdeploy's check off). Instances hold no per-image state, so one may be shared by threads.
    """

    def __init__(self, spec: PreprocessSpec, max_pixels: int | None = MAX_IMAGE_PIXELS) -> None:
        if spec.interpolation not in _RESAMPLE:
            raise ValueError(f"unknown interpolation {spec.interpolation!r}; expected one of {sorted(_RESAMPLE)}")
        self.spec = spec
        self.max_pixels = max_pixels
        self._resample = _RESAMPLE[spec.interpolation]
        mean = np.asarray(spec.mean, dtype=np.float64)
        std = np.asarray(spec.std, dtype=np.float64)
        self._scale = (1.0 / (255.0 * std)).astype(np.float32).reshape(3, 1, 1)
        self._offset = (-mean / std).astype(np.float32).reshape(3, 1, 1)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(3, height, width) of one preprocessed image."""
        return (3, self.spec.height, self.spec.width)

    def __call__(self, source: ImageSource) -> np.ndarray:
        """One image -> (3, H, W) float32. Raises :class:`InputError` for an unusable input."""
        out = np.empty(self.output_shape, dtype=np.float32)
        self._into(source, out)
        return out

    def batch(self, sources: Iterable[ImageSource]) -> np.ndarray:
        """Images -> (N, 3, H, W) float32; raises :class:`InputError` at the first bad one
        (the message says which item)."""
        items = list(sources)
        out = np.empty((len(items), *self.output_shape), dtype=np.float32)
        for i, src in enumerate(items):
            try:
                self._into(src, out[i])
            except InputError as exc:
                raise InputError(f"batch item {i}: {exc}") from exc
        return out

    def batch_tolerant(self, sources: Iterable[ImageSource]) -> tuple[np.ndarray, list[int], dict[int, str]]:
        """Like :meth:`batch`, but one bad image never sinks the others.

        Returns ``(pixels, good, errors)``: ``pixels`` is (len(good), 3, H, W) float32 for the
        inputs whose indices are listed in ``good`` (ascending), and ``errors`` maps the index
        of every input that failed with :class:`InputError` to its message. Anything other than
        an ``InputError`` (a bug, MemoryError) still propagates.
        """
        items = list(sources)
        out = np.empty((len(items), *self.output_shape), dtype=np.float32)
        good: list[int] = []
        errors: dict[int, str] = {}
        for i, src in enumerate(items):
            try:
                self._into(src, out[len(good)])
            except InputError as exc:
                errors[i] = str(exc)
                log.debug("skipping input %d: %s", i, exc)  # callers report the errors they get back
                continue
            good.append(i)
        return out[: len(good)], good, errors

    # ----------------------------------------------------------------------------------------

    def resize_crop(self, img: Image.Image) -> Image.Image:
        """The geometric step alone: an RGB (or L) image -> the same mode at (width, height)
        (RGB when padding with a colour that is not grey)."""
        th, tw = self.spec.height, self.spec.width
        plan = resize_plan(img.size, self.spec)
        if plan.size == img.size == (tw, th):
            return img
        new_w, new_h = plan.size
        # The part of the crop box inside the resized image; the rest (if any) is padding.
        x0, y0 = max(plan.left, 0), max(plan.top, 0)
        x1, y1 = min(plan.left + tw, new_w), min(plan.top + th, new_h)
        if new_w * new_h <= MAX_INTERMEDIATE_PIXELS:
            if plan.size != img.size:
                img = img.resize(plan.size, self._resample)
            if (x0, y0, x1, y1) != (0, 0, new_w, new_h):
                img = img.crop((x0, y0, x1, y1))
        else:
            img = _resize_crop_large(img, new_w, new_h, x0, y0, x1 - x0, y1 - y0, self._resample)
        if img.size == (tw, th):
            return img
        fill = plan.fill
        if img.mode == "L" and len(set(fill)) > 1:
            img = img.convert("RGB")
        canvas = Image.new(img.mode, (tw, th), fill[0] if img.mode == "L" else fill)
        canvas.paste(img, (x0 - plan.left, y0 - plan.top))
        return canvas

    def _into(self, source: ImageSource, out: np.ndarray) -> None:
        # Greyscale stays one channel through the resize (bit-identical, a third of the work).
        img = load_image(source, background=self.spec.background, max_pixels=self.max_pixels, keep_grey=True)
        img = self.resize_crop(img)
        pixels = np.asarray(img)
        # (x - mean) / std with x in 0..255 as one multiply-add. Reading HWC through a CHW view
        # lets the ufunc transpose while it converts; a grey (H, W) plane broadcasts to 3 channels.
        chw = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        np.multiply(chw, self._scale, out=out)
        np.add(out, self._offset, out=out)


class ResizePlan(NamedTuple):
    """Where one image goes: resize to ``size`` = (w, h), then take the (width, height) box at
    (``left``, ``top``) of the resized image; box parts outside it are ``fill`` (RGB 0-255)."""

    size: tuple[int, int]
    left: int
    top: int
    fill: tuple[int, int, int]


def resize_plan(size: tuple[int, int], spec: PreprocessSpec) -> ResizePlan:
    """The resize and crop ``spec``'s library does to an image of ``size`` = (w, h)."""
    th, tw = spec.height, spec.width
    black = (0, 0, 0)
    if spec.style == "hf":
        new_w, new_h = hf_resize_size(size, spec)
        # transformers' center_crop: (size - crop) // 2, floored; the image is zero-padded when smaller.
        return ResizePlan((new_w, new_h), (new_w - tw) // 2, (new_h - th) // 2, black)
    if spec.style == "torchvision":
        new_w, new_h = _shorter_side_to(size, spec.shortest_edge)  # type: ignore[arg-type]
        return ResizePlan((new_w, new_h), _round_offset(new_w, tw), _round_offset(new_h, th), black)
    scale_h, scale_w = math.floor(th / spec.crop_pct), math.floor(tw / spec.crop_pct)
    if spec.crop_mode == "squash":
        new_w, new_h = scale_w, scale_h
    elif spec.crop_mode == "border":  # timm ResizeKeepRatio(longest=1) then CenterCropOrPad(fill=mean)
        w, h = size
        ratio = max(h / scale_h, w / scale_w)
        new_w, new_h = round(w / ratio), round(h / ratio)
        fill = tuple(round(255 * m) for m in spec.mean)
        return ResizePlan((new_w, new_h), _round_offset(new_w, tw), _round_offset(new_h, th), fill)  # type: ignore[arg-type]
    else:
        new_w, new_h = timm_resize_size(size, (th, tw), spec.crop_pct)
    return ResizePlan((new_w, new_h), _round_offset(new_w, tw), _round_offset(new_h, th), black)


def _round_offset(size: int, crop: int) -> int:
    """torchvision's centre crop (timm uses it too): pad ``(crop - size) // 2`` before when the
    image is smaller, else start at ``int(round((size - crop) / 2))``."""
    if crop > size:
        return -((crop - size) // 2)
    return int(round((size - crop) / 2.0))


def _shorter_side_to(size: tuple[int, int], short: int) -> tuple[int, int]:
    """torchvision ``Resize(int)`` / transformers ``shortest_edge``: (w, h) with the shorter side
    ``short`` and the longer ``int(short * long / short_side)``."""
    w, h = size
    if w <= h:
        return short, int(short * h / w)
    return int(short * w / h), short


def hf_resize_size(size: tuple[int, int], spec: PreprocessSpec) -> tuple[int, int]:
    """(w, h) after transformers' resize (PIL backend) for each form of ``size``."""
    if spec.shortest_edge is None:
        return (spec.resize_width or spec.width, spec.resize_height or spec.height)
    if spec.longest_edge is None:  # get_resize_output_image_size(default_to_square=False)
        return _shorter_side_to(size, spec.shortest_edge)
    # get_size_with_aspect_ratio(image_size, shortest_edge, longest_edge), step for step.
    w, h = size
    short, raw = spec.shortest_edge, None
    lo, hi = float(min(h, w)), float(max(h, w))
    if hi / lo * short > spec.longest_edge:
        raw = spec.longest_edge * lo / hi
        short = int(round(raw))
    if (h <= w and h == short) or (w <= h and w == short):
        return w, h
    if w < h:
        return short, int((raw if raw is not None else short) * h / w)
    return int((raw if raw is not None else short) * w / h), short


def timm_resize_size(size: tuple[int, int], target: tuple[int, int], crop_pct: float) -> tuple[int, int]:
    """(new_width, new_height) of timm's eval resize for an image of ``size`` = (w, h) and a
    ``target`` = (height, width), before the centre crop. Both results are >= the target."""
    w, h = size
    th, tw = target
    scale_h, scale_w = math.floor(th / crop_pct), math.floor(tw / crop_pct)
    if scale_h == scale_w:
        s = scale_h
        if w <= h:
            new_w, new_h = s, int(s * h / w)
        else:
            new_w, new_h = int(s * w / h), s
    else:
        ratio = min(h / scale_h, w / scale_w)
        new_w, new_h = round(w / ratio), round(h / ratio)
    # Never smaller than the crop (float rounding; torchvision would pad with zeros here).
    return max(new_w, tw), max(new_h, th)


def _resize_crop_large(
    img: Image.Image, new_w: int, new_h: int, left: int, top: int, tw: int, th: int, resample: Image.Resampling
) -> Image.Image:
    """Resize-then-crop when the full resize would be huge: two 1-D passes (horizontal, then
    vertical), each resampling only the band the crop keeps (Pillow's ``box``). Within one
    8-bit level of the full resize for the smooth filters: Pillow's float32 box coordinates and
    its own choice of pass order make it not bit-exact, which is why this is only a fallback."""
    w, h = img.size
    if new_w != w or left or tw != w:
        sx = w / new_w
        img = img.resize((tw, h), resample, box=(left * sx, 0, (left + tw) * sx, h))
    if new_h != h or top or th != h:
        sy = h / new_h
        img = img.resize((tw, th), resample, box=(0, top * sy, tw, (top + th) * sy))
    return img


__all__ = [
    "MAX_INTERMEDIATE_PIXELS",
    "Preprocessor",
    "ResizePlan",
    "hf_resize_size",
    "resize_plan",
    "timm_resize_size",
]
