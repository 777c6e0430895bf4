"""Our preprocessing against references, on real photos (scikit-image's bundled data, no
downloads).

* style "hf": transformers' ViT image processor, built directly (no hub), must give the same
  pixel_values (max abs diff <= 1e-5). We construct ``ViTImageProcessorPil``: in transformers
  5.x ``ViTImageProcessor`` is the torchvision backend and falls back to this PIL one when
  torchvision is missing (as here); the torchvision backend resizes with its own kernels and
  is not what our Pillow pipeline mirrors. ``do_convert_rgb=True`` is passed because without it
  the processor keeps greyscale as one channel and cannot normalise with 3 means; with it,
  transparency is composited over white, which is our default background, so RGBA and palette
  images are compared too.
* style "timm": an independent, straightforward implementation written here from timm's
  ``transforms_imagenet_eval`` (crop_mode "center"): torchvision ``Resize(int)`` for square
  targets, ``ResizeKeepRatio`` for non-square ones, torchvision ``center_crop`` rounding, float64
  normalisation.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image, ImageOps

from vitdeploy.base.preprocess_spec import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, PreprocessSpec
from vitdeploy.runtime.preprocess import Preprocessor

skdata = pytest.importorskip("skimage.data", reason="scikit-image not installed (pip install scikit-image)")

TOL = 1e-5
RESAMPLE = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _photos() -> dict[str, bytes]:
    """name -> encoded file bytes; real photos of different sizes and modes."""
    out: dict[str, bytes] = {}
    # 512x512, 600x400, 451x300, 512x512 greyscale, 640x427
    for name in ("astronaut", "coffee", "chelsea", "camera", "rocket"):
        out[f"{name}.png"] = _encode(Image.fromarray(getattr(skdata, name)()), "PNG")
    out["rocket.jpg"] = _encode(Image.fromarray(skdata.rocket()), "JPEG", quality=90)
    out["camera.jpg"] = _encode(Image.fromarray(skdata.camera()), "JPEG", quality=90)
    out["logo-rgba.png"] = _encode(Image.fromarray(skdata.logo()), "PNG")  # real alpha edges
    coffee = Image.fromarray(skdata.coffee()).convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, coffee.width).astype(np.uint8), (coffee.height, 1))
    coffee.putalpha(Image.fromarray(alpha))
    out["coffee-rgba.png"] = _encode(coffee, "PNG")
    palette = Image.fromarray(skdata.chelsea()).quantize(colors=200)
    assert palette.mode == "P"
    out["chelsea-palette.png"] = _encode(palette, "PNG")
    return out


PHOTOS = _photos()


def _modes() -> set[str]:
    return {Image.open(io.BytesIO(b)).mode for b in PHOTOS.values()}


def test_photo_set_covers_the_modes() -> None:
    assert {"RGB", "L", "RGBA", "P"} <= _modes()


# ---------------------------------------------------------------------------------------------
# hf style vs transformers


HF_CASES = [
    ((224, 224), "bilinear", INCEPTION_MEAN, INCEPTION_STD),
    ((384, 384), "bicubic", IMAGENET_MEAN, IMAGENET_STD),
    ((160, 256), "lanczos", IMAGENET_MEAN, IMAGENET_STD),
]


@pytest.fixture(scope="module")
def hf_processor_cls():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cls = getattr(transformers, "ViTImageProcessorPil", None)
    if cls is None:  # transformers 4.x: the PIL implementation is ViTImageProcessor itself
        cls = transformers.ViTImageProcessor
    return cls


@pytest.mark.parametrize("case", HF_CASES, ids=lambda c: f"{c[0][0]}x{c[0][1]}-{c[1]}")
def test_hf_style_matches_transformers(hf_processor_cls, case) -> None:
    (height, width), interp, mean, std = case
    processor = hf_processor_cls(
        size={"height": height, "width": width},
        resample=int(RESAMPLE[interp]),
        image_mean=list(mean),
        image_std=list(std),
        do_resize=True,
        do_rescale=True,
        do_normalize=True,
    )
    spec = PreprocessSpec(style="hf", height=height, width=width, interpolation=interp, mean=mean, std=std)
    pre = Preprocessor(spec)
    names = list(PHOTOS)
    ours = pre.batch([PHOTOS[n] for n in names])
    for i, name in enumerate(names):
        reference = processor(images=Image.open(io.BytesIO(PHOTOS[name])), return_tensors="np", do_convert_rgb=True)[
            "pixel_values"
        ][0]
        assert reference.shape == ours[i].shape == (3, height, width), name
        diff = float(np.abs(reference - ours[i]).max())
        assert diff <= TOL, f"{name}: max abs diff {diff}"


def test_hf_style_matches_transformers_on_exif_rotated_jpeg(hf_processor_cls) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _encode(Image.fromarray(skdata.chelsea()), "JPEG", quality=90, exif=exif.tobytes())
    processor = hf_processor_cls(size={"height": 224, "width": 224}, resample=int(Image.Resampling.BILINEAR))
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert upright.size == (300, 451)  # really rotated
    reference = processor(images=upright, return_tensors="np")["pixel_values"][0]
    spec = PreprocessSpec(style="hf", mean=tuple(processor.image_mean), std=tuple(processor.image_std))
    ours = Preprocessor(spec)(data)
    assert float(np.abs(reference - ours).max()) <= TOL


# ---------------------------------------------------------------------------------------------
# timm style vs an independent straightforward implementation


def _timm_reference(data: bytes, height: int, width: int, crop_pct: float, interp: str, mean, std) -> np.ndarray:
    img = Image.open(io.BytesIO(data))
    img = ImageOps.exif_transpose(img)
    if img.mode in ("RGBA", "LA", "P") and (img.mode != "P" or "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    img = img.convert("RGB")
    w, h = img.size
    scale_h, scale_w = math.floor(height / crop_pct), math.floor(width / crop_pct)
    if scale_h == scale_w:  # torchvision Resize(int): shorter side -> size, longer truncated
        if w <= h:
            new_w, new_h = scale_w, int(scale_w * h / w)
        else:
            new_h, new_w = scale_h, int(scale_h * w / h)
    else:  # timm ResizeKeepRatio(longest=0)
        ratio = min(h / scale_h, w / scale_w)
        new_h, new_w = round(h / ratio), round(w / ratio)
    img = img.resize((new_w, new_h), RESAMPLE[interp])
    top = int(round((new_h - height) / 2.0))
    left = int(round((new_w - width) / 2.0))
    box = (left, top, left + width, top + height)
    img = img.crop(box)
    x = np.asarray(img, dtype=np.float64) / 255.0
    x = (x - np.asarray(mean)) / np.asarray(std)
    return x.transpose(2, 0, 1)


TIMM_CASES = [
    ((224, 224), 0.875, "bilinear"),
    ((384, 384), 1.0, "bicubic"),
    ((160, 160), 0.9, "lanczos"),
    ((224, 320), 0.95, "bicubic"),  # non-square target
]


@pytest.mark.parametrize("case", TIMM_CASES, ids=lambda c: f"{c[0][0]}x{c[0][1]}-{c[1]}-{c[2]}")
def test_timm_style_matches_reference_implementation(case) -> None:
    (height, width), crop_pct, interp = case
    spec = PreprocessSpec(
        style="timm",
        height=height,
        width=width,
        crop_pct=crop_pct,
        interpolation=interp,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )
    pre = Preprocessor(spec)
    for name, data in PHOTOS.items():
        reference = _timm_reference(data, height, width, crop_pct, interp, IMAGENET_MEAN, IMAGENET_STD)
        ours = pre(data)
        assert ours.shape == reference.shape, name
        diff = float(np.abs(reference - ours).max())
        assert diff <= TOL, f"{name}: max abs diff {diff}"
