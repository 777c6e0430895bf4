"""Decode anything a user may hand us into one oriented RGB ``PIL.Image`` (numpy + Pillow only).

The one entry point is :func:`load_image`. It accepts a path, encoded bytes, a ``PIL.Image`` or
a uint8 numpy array and returns an RGB image with the EXIF orientation applied:

* Only :data:`SUPPORTED_FORMATS` are parsed (``Image.open(..., formats=...)``), so a file that
  merely *claims* to be an image never reaches Pillow's rarer, less-hardened decoders.
* Decompression bombs are refused after the header is read and before any pixel is decoded:
  ``width * height > max_pixels`` raises :class:`~vitdeploy.base.errors.InputError` naming the
  source, the pixel count and the limit. Pillow's own hard ceiling (``2 *
  PIL.Image.MAX_IMAGE_PIXELS``) still applies inside ``Image.open``; to accept images above it,
  raise ``PIL.Image.MAX_IMAGE_PIXELS`` as well as ``max_pixels``.
* Pixels are decoded eagerly (``Image.load()``) so truncated or corrupt files fail here, with the
  source named, and not later inside a resize. (If other code sets
  ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True`` Pillow fills truncated JPEGs with grey instead;
  that global is left alone.)
* Animated GIF / WebP / APNG and multi-page TIFF: the first frame (for a ``PIL.Image`` passed
  in, whichever frame it is currently on).

Mode conversion to RGB (``background`` is an RGB 0-255 triple, white by default):

=====================  ==================================================================
RGB                    unchanged
RGBA, LA, La, RGBa, PA alpha composited over ``background`` (``Image.alpha_composite``)
P / L / RGB with tRNS  the transparent colour/index becomes alpha, then composited as above
P                      palette expanded
1, L, CMYK, YCbCr,     Pillow's ``convert("RGB")`` (CMYK is the naive transform: pure cyan
HSV, RGBX              (255,0,0,0) -> (0,255,255))
LAB                    CIE L*a*b* -> sRGB through littlecms (``PIL.ImageCms``)
I;16, I;16L/B/N        16-bit greyscale scaled by the bit depth: round(v * 255 / 65535)
I                      32-bit container: TIFF BitsPerSample/SampleFormat decide the depth; other
                       sources are treated as 16-bit when every value is in [0, 65535], else as
                       signed 32-bit (-2**31 -> 0, 2**31-1 -> 255). Scaled, never clipped.
F                      float: values in [0, 1] are scaled by 255, other ranges are taken as
                       0-255 and clipped; NaN/inf is refused
=====================  ==================================================================
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any, NamedTuple, Union

import numpy as np
from PIL import Image, ImageOps

from ..base.errors import EmptyImageError, ImageError, ImageTooLargeError, InputError, NotAnImageError
from .image_paths import IMAGE_EXTENSIONS

log = logging.getLogger(__name__)

#: Default decompression-bomb limit, in pixels: the same number as Pillow's default warning
#: threshold (``PIL.Image.MAX_IMAGE_PIXELS``, ~89.5 Mpx, i.e. 1 GiB of 24-bit pixels / 4 / 3).
MAX_IMAGE_PIXELS: int = 89_478_485

#: The only Pillow decoders ``load_image`` lets parse a file or bytes.
SUPPORTED_FORMATS: frozenset[str] = frozenset({"PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF"})
# Deterministic order for Image.open (it tries the formats in the order given).
_FORMAT_ORDER = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")

#: File extensions (lower case) that :func:`is_image_path` and :func:`iter_image_paths` accept.

ImageSource = Union[str, os.PathLike, bytes, bytearray, memoryview, Image.Image, np.ndarray]

_DEFAULT_BACKGROUND = (255, 255, 255)
_ALPHA_MODES = frozenset({"RGBA", "LA", "La", "RGBa", "PA"})
_ORIENTATION_TAG = 0x0112
_WARNINGS_LOCK = threading.Lock()


class _Options(NamedTuple):
    background: tuple[int, int, int]
    max_pixels: int | None
    keep_grey: bool


# --------------------------------------------------------------------------------------------
# public API


def load_image(
    source: ImageSource,
    *,
    background: tuple[int, int, int] = _DEFAULT_BACKGROUND,
    max_pixels: int | None = MAX_IMAGE_PIXELS,
    keep_grey: bool = False,
) -> Image.Image:
    """Return ``source`` as an RGB ``PIL.Image`` with its EXIF orientation applied.

    ``source`` is a path (``str`` / ``os.PathLike``), encoded image bytes (``bytes``,
    ``bytearray``, ``memoryview``), a ``PIL.Image.Image``, or a uint8 numpy array shaped
    (H, W), (H, W, 1), (H, W, 3) (RGB) or (H, W, 4) (RGBA). Transparency is composited over
    ``background``. ``max_pixels=None`` disables vitdeploy's bomb check (Pillow's remains).

    ``keep_grey=True`` returns mode "L" instead of RGB for greyscale sources without
    transparency (1, L, I;16, I, F): for callers that treat L as R = G = B, resampling one
    channel instead of three gives bit-identical results at a third of the cost.

    A ``PIL.Image`` that is already RGB, upright and loaded may be returned as is (not
    copied); callers must not modify the result in place if they passed their own image.

    Raises :class:`InputError` naming the source (the path, ``"<bytes>"``, ``"<array>"`` or
    ``"<PIL image>"``) and the cause for anything unusable.
    """
    opts = _Options(_check_background(background), max_pixels, keep_grey)
    if isinstance(source, Image.Image):
        return _finish(source, "<PIL image>", opts)
    if isinstance(source, np.ndarray):
        return _from_array(source, opts)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source) if not isinstance(source, bytes) else source
        if not data:
            raise EmptyImageError("<bytes>: empty input (0 bytes); expected an encoded image")
        return _from_stream(io.BytesIO(data), "<bytes>", opts)
    if isinstance(source, (str, os.PathLike)):
        return _from_path(Path(os.fspath(source)), opts)
    raise InputError(
        f"unsupported image input of type {type(source).__name__}; expected a path, encoded "
        "bytes, a PIL.Image.Image or a uint8 numpy array (H,W), (H,W,3) or (H,W,4)"
    )


# --------------------------------------------------------------------------------------------
# sources


def _from_path(path: Path, opts: _Options) -> Image.Image:
    name = str(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after every read of the file
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, expected an image file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read the file ({exc.strerror or exc})") from None
    # Everything that reads from the file (decode, EXIF, frame 0) happens inside this block; the
    # image returned is fully loaded, so closing our handle afterwards is safe.
    with f:
        return _from_stream(f, name, opts)


@contextlib.contextmanager
def _no_bomb_warning() -> Any:
    """Pillow warns (DecompressionBombWarning, on stderr, with its own file path) above
    ``PIL.Image.MAX_IMAGE_PIXELS`` and raises above twice that. vitdeploy decides itself, per
    image, from ``max_pixels`` (runtime.max_image_pixels): a clean InputError or a clean
    acceptance, so the warning is silenced while a header is read. ``catch_warnings`` swaps a
    process-wide filter list, hence the lock: header parsing is microseconds."""
    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def _from_stream(fp: Any, name: str, opts: _Options) -> Image.Image:
    try:
        with _no_bomb_warning():
            img = Image.open(fp, formats=_FORMAT_ORDER)
    except Image.UnidentifiedImageError:
        raise _unidentified_error(fp, name) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's own ceiling fired inside Image.open (header only, nothing decoded yet).
        raise ImageTooLargeError(_pillow_bomb_message(name, exc, opts.max_pixels)) from None
    except Exception as exc:  # noqa: BLE001 - a malformed header can raise many types
        raise ImageError(
            f"{name}: cannot read the image header ({type(exc).__name__}: {exc}); the file is "
            "truncated, corrupt or not really an image"
        ) from None
    return _finish(img, name, opts)


def _from_array(arr: np.ndarray, opts: _Options) -> Image.Image:
    name = "<array>"
    if arr.dtype != np.uint8:
        raise InputError(
            f"{name}: dtype {arr.dtype} not supported; expected uint8 pixels 0-255 in HWC "
            "layout (convert with arr.astype(np.uint8) after scaling)"
        )
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))):
        raise InputError(
            f"{name}: shape {arr.shape} not supported; expected (H, W), (H, W, 1), (H, W, 3) "
            "RGB or (H, W, 4) RGBA, channels last (for CHW arrays use arr.transpose(1, 2, 0))"
        )
    h, w = arr.shape[:2]
    _check_size(name, w, h, opts.max_pixels)
    # uint8 (H,W) -> "L", (H,W,3) -> "RGB", (H,W,4) -> "RGBA": fromarray infers the mode.
    img = Image.fromarray(np.ascontiguousarray(arr))
    return _to_rgb(img, name, opts)


# --------------------------------------------------------------------------------------------
# the shared tail: size check, decode, orientation, mode conversion


def _finish(img: Image.Image, name: str, opts: _Options) -> Image.Image:
    w, h = img.size
    _check_size(name, w, h, opts.max_pixels)  # header only: nothing has been decoded yet
    try:
        img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLargeError(_pillow_bomb_message(name, exc, opts.max_pixels)) from None
    except MemoryError:
        raise  # the machine, not the input: let callers see it
    except Exception as exc:  # noqa: BLE001 - decoders raise OSError, SyntaxError, ValueError...
        fmt = img.format or "image"
        raise ImageError(
            f"{name}: cannot decode {fmt} data ({w}x{h}): {type(exc).__name__}: {exc}; the "
            "file is truncated or corrupt (re-export or re-download it)"
        ) from None
    img = _orient(img, name)
    return _to_rgb(img, name, opts)


def _check_size(name: str, w: int, h: int, max_pixels: int | None) -> None:
    if w <= 0 or h <= 0:
        raise InputError(f"{name}: image has no pixels ({w}x{h}); expected width and height >= 1")
    pixels = w * h
    if max_pixels is not None and pixels > max_pixels:
        raise ImageTooLargeError(
            f"{name}: {w}x{h} = {pixels} pixels exceeds the limit of {max_pixels} pixels; "
            "refused before decoding (decompression-bomb guard). If the image is trusted, "
            "raise max_pixels (runtime.max_image_pixels in pipeline.yaml)"
        )


def _orient(img: Image.Image, name: str) -> Image.Image:
    try:
        orientation = img.getexif().get(_ORIENTATION_TAG, 1)
    except Exception as exc:  # noqa: BLE001 - a broken EXIF block should not sink the image
        log.warning("%s: ignoring unreadable EXIF data (%s)", name, exc)
        return img
    if orientation in (2, 3, 4, 5, 6, 7, 8):
        try:
            return ImageOps.exif_transpose(img)
        except Exception as exc:  # noqa: BLE001
            raise InputError(f"{name}: cannot apply EXIF orientation {orientation}: {exc}") from None
    return img


def _has_transparency(img: Image.Image) -> bool:
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        return True
    return img.mode == "P" and img.palette is not None and img.palette.mode == "RGBA"


def _to_rgb(img: Image.Image, name: str, opts: _Options) -> Image.Image:
    mode = img.mode
    if mode.startswith("I") or mode == "F":
        img = _high_depth_to_l(img, name)  # -> "L"; no transparency survives here
        mode = "L"
    try:
        if _has_transparency(img):
            if mode == "La":  # premultiplied; Pillow converts it to LA only
                img = img.convert("LA")
            rgba = img.convert("RGBA")
            bg = Image.new("RGBA", rgba.size, (*opts.background, 255))
            return Image.alpha_composite(bg, rgba).convert("RGB")
        if mode == "RGB":
            return img
        if opts.keep_grey and mode in ("L", "1"):
            return img if mode == "L" else img.convert("L")
        if mode == "LAB":
            return _lab_to_rgb(img, name)
        return img.convert("RGB")
    except (ValueError, OSError) as exc:
        raise InputError(f"{name}: cannot convert image mode {mode!r} to RGB ({exc})") from None


def _lab_to_rgb(img: Image.Image, name: str) -> Image.Image:
    """CIE L*a*b* -> sRGB through littlecms (Pillow's plain convert() copies the bytes)."""
    try:
        from PIL import ImageCms

        transform = ImageCms.buildTransform(
            ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"), "LAB", "RGB"
        )
    except Exception as exc:  # noqa: BLE001 - Pillow built without littlecms
        raise InputError(f"{name}: L*a*b* image needs Pillow's littlecms support (PIL.ImageCms): {exc}") from None
    return ImageCms.applyTransform(img, transform)


def _high_depth_to_l(img: Image.Image, name: str) -> Image.Image:
    """Scale 16/32-bit integer or float greyscale to 8-bit by the data's bit depth."""
    arr = np.asarray(img)
    if img.mode == "F":
        arr = arr.astype(np.float64, copy=False)
        if not np.isfinite(arr).all():
            raise InputError(f"{name}: float image contains NaN or infinity")
        if arr.size and arr.min() >= 0.0 and arr.max() <= 1.0:
            arr = arr * 255.0
        out = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        return Image.fromarray(out)
    if arr.dtype.kind not in "iu":
        raise InputError(f"{name}: image mode {img.mode!r} is not supported")
    bits, signed = _bit_depth(img, arr)
    arr = arr.astype(np.int64)
    lo = -(1 << (bits - 1)) if signed else 0
    span = (1 << bits) - 1
    # round((v - lo) * 255 / span) in exact integer arithmetic
    out = ((arr - lo) * 255 + span // 2) // span
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))


def _bit_depth(img: Image.Image, arr: np.ndarray) -> tuple[int, bool]:
    """(bits, signed) for an integer greyscale image."""
    if img.mode.startswith("I;16"):
        return 16, arr.dtype.kind == "i" or img.mode.endswith("S")
    tags = getattr(img, "tag_v2", None)  # TIFF says what it stored
    if tags is not None:
        bits = tags.get(258)
        bits = bits[0] if isinstance(bits, tuple) and bits else bits
        if isinstance(bits, int) and bits in (8, 16, 32):
            fmt = tags.get(339, 1)
            fmt = fmt[0] if isinstance(fmt, tuple) and fmt else fmt
            return bits, fmt == 2
    if arr.size == 0 or (arr.min() >= 0 and arr.max() <= 0xFFFF):
        return 16, False
    return 32, True


def _check_background(background: Any) -> tuple[int, int, int]:
    try:
        bg = tuple(int(v) for v in background)
    except (TypeError, ValueError):
        bg = ()
    if len(bg) != 3 or not all(0 <= v <= 255 for v in bg):
        raise InputError(f"background must be 3 integers 0-255 (RGB), got {background!r}")
    return bg  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# messages and walking


def _pillow_bomb_message(name: str, exc: BaseException, max_pixels: int | None) -> str:
    return (
        f"{name}: refused before decoding (decompression-bomb guard): {exc}. vitdeploy's limit is "
        f"max_pixels={max_pixels}; Pillow's own ceiling is 2 * PIL.Image.MAX_IMAGE_PIXELS = "
        f"{2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else 'off'}. If the image is "
        "trusted, raise both"
    )


_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"BM", "BMP"),
)


def _sniff(head: bytes) -> str | None:
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for magic, fmt in _SIGNATURES:
        if head.startswith(magic):
            return fmt
    return None


def _unidentified_error(fp: Any, name: str) -> InputError:
    """The typed error for bytes Pillow does not recognise: empty, a known format's broken header, or no image."""
    head = b""
    try:
        fp.seek(0)
        head = fp.read(512)
    except Exception:  # noqa: BLE001 - best effort, for the message only
        pass
    supported = ", ".join(sorted(SUPPORTED_FORMATS))
    if not head:
        return EmptyImageError(f"{name}: empty file (0 bytes); expected an image ({supported})")
    fmt = _sniff(head)
    if fmt is not None:
        return ImageError(
            f"{name}: starts like a {fmt} file but its header cannot be read (truncated, "
            "corrupt, or a zero width/height image); re-export or re-download it"
        )
    detail = f" (first bytes: {head[:8].hex(' ')})"
    text = _as_text(head)
    if text is not None:
        detail = f" (its content looks like text: {text[:40].strip()!r})"
    return NotAnImageError(
        f"{name}: not a recognised image{detail}; supported formats are {supported}. The file "
        "may be corrupt, mis-named, or in another format (HEIC, SVG, PDF, ICO, ...): convert it "
        "first"
    )


def _as_text(head: bytes) -> str | None:
    """``head`` decoded when it is printable UTF-8 text (a cut multi-byte character at the
    end is allowed), else None."""
    for cut in (len(head), len(head) - 1, len(head) - 2, len(head) - 3):
        try:
            text = head[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip() and all(c.isprintable() or c in "\r\n\t" for c in text):
            return text
        return None
    return None


__all__ = ["IMAGE_EXTENSIONS", "MAX_IMAGE_PIXELS", "SUPPORTED_FORMATS", "ImageSource", "load_image"]
