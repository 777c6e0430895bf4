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
4. geometry, with Pillow's resampling filter ``spec.interpolation``:

   * ``style="hf"`` (transformers' ``ViTImageProcessor``): resize straight to
     ``(spec.height, spec.width)``, ignoring the aspect ratio;
   * ``style="timm"`` (timm ``transforms_imagenet_eval``, ``crop_mode="center"``): scale size
     ``(floor(height / crop_pct), floor(width / crop_pct))``. Square target: the shorter side
     becomes that size and the longer ``int(size * long / short)`` (torchvision ``Resize(int)``).
     Non-square target: timm's ``ResizeKeepRatio``: one ratio ``min(h / scale_h, w / scale_w)``,
     new size ``round(h / ratio), round(w / ratio)``, so the result covers the scale size. Then
     a centre crop of ``(height, width)`` at ``top = round((new_h - height) / 2)`` (likewise
     ``left``; Python's round, as torchvision's ``center_crop``). Where the full intermediate
     would exceed :data:`MAX_INTERMEDIATE_PIXELS` (4 Mpx: aspect ratios beyond ~64:1 at 224)
     only the band kept by the crop is resampled, which may differ from the full resize by one
     8-bit level (one source pixel for "nearest"/"box"), so a 1 x 10000 image stays cheap.
     Below that limit the result is bit-identical to the full resize then crop, but computed
     with less work where the installed Pillow's pass order is known (see
     :func:`_resize_crop_exact`): about a fifth less resampling for ImageNet-size photos.

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

import numpy as np
from PIL import Image

from ..errors import InputError
from .images import MAX_IMAGE_PIXELS, ImageSource, load_image
from ..preprocess_spec import PreprocessSpec

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
            raise ValueError(
                f"unknown interpolation {spec.interpolation!r}; expected one of {sorted(_RESAMPLE)}"
            )
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

    def batch_tolerant(
        self, sources: Iterable[ImageSource]
    ) -> tuple[np.ndarray, list[int], dict[int, str]]:
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
        """The geometric step alone: an RGB (or L) image -> the same mode at (width, height)."""
        th, tw = self.spec.height, self.spec.width
        if self.spec.style == "hf":
            if img.size == (tw, th):
                return img
            return img.resize((tw, th), self._resample)
        new_w, new_h = timm_resize_size(img.size, (th, tw), self.spec.crop_pct)
        top = int(round((new_h - th) / 2.0))
        left = int(round((new_w - tw) / 2.0))
        if new_w * new_h <= MAX_INTERMEDIATE_PIXELS:
            if (new_w, new_h) != img.size:
                img = img.resize((new_w, new_h), self._resample)
            if (new_w, new_h) != (tw, th):
                img = img.crop((left, top, left + tw, top + th))
            return img
        return _resize_crop_large(img, new_w, new_h, left, top, tw, th, self._resample)

    def _into(self, source: ImageSource, out: np.ndarray) -> None:
        # Greyscale stays one channel through the resize (bit-identical, a third of the work).
        img = load_image(
            source, background=self.spec.background, max_pixels=self.max_pixels, keep_grey=True
        )
        img = self.resize_crop(img)
        pixels = np.asarray(img)
        # (x - mean) / std with x in 0..255 as one multiply-add. Reading HWC through a CHW view
        # lets the ufunc transpose while it converts; a grey (H, W) plane broadcasts to 3 channels.
        chw = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        np.multiply(chw, self._scale, out=out)
        np.add(out, self._offset, out=out)


def timm_resize_size(
    size: tuple[int, int], target: tuple[int, int], crop_pct: float
) -> tuple[int, int]:
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
    img: Image.Image, new_w: int, new_h: int, left: int, top: int, tw: int, th: int,
    resample: Image.Resampling,
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


__all__ = ["MAX_INTERMEDIATE_PIXELS", "Preprocessor", "timm_resize_size"]
