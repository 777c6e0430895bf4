"""The demo model shipped inside the package: a small ViT trained on scikit-learn's digits.

It lets anyone run export, validation and every runtime backend with no checkpoint of their
own and no network. Files in this folder:

    model.safetensors, model.json   the weights and their config (the vitdeploy checkpoint format)
    MODEL_CARD.md                   what it is, how it was trained, how well it does
    images/                         held-out digits (PNG and JPEG, 64x64) and images/labels.csv

``render_digit`` is the one way an 8x8 digit (values 0..16) becomes a picture: dark ink on
white paper, upscaled with Pillow. Training used it, and so did the shipped images, so the
model sees the same pixels at train and at serve time. Only Pillow and numpy are needed here.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

DEMO_DIR = Path(__file__).resolve().parent
IMAGES_DIR = DEMO_DIR / "images"
WEIGHTS_PATH = DEMO_DIR / "model.safetensors"
CONFIG_PATH = DEMO_DIR / "model.json"
LABELS_CSV = IMAGES_DIR / "labels.csv"

RENDER_SIZE = 64  # pixels per side of a rendered digit; the model's preprocessing resizes to 32
DIGIT_MAX = 16  # scikit-learn's digits are 8x8 counts of ink in 0..16


def render_digit(values: Any, size: int = RENDER_SIZE) -> Any:
    """An 8x8 array of ink counts (0..16) as a ``size`` x ``size`` RGB PIL image.

    Ink is dark on white paper: 0 -> 255 (white), 16 -> 0 (black), linear in between, rounded
    to uint8, then upscaled with bilinear resampling and converted to RGB.
    """
    import numpy as np
    from PIL import Image

    arr = np.asarray(values, dtype=np.float64).reshape(8, 8)
    if arr.min() < 0 or arr.max() > DIGIT_MAX:
        raise ValueError(f"digit values must lie in 0..{DIGIT_MAX}, got {arr.min()}..{arr.max()}")
    gray = np.rint(255.0 - arr * (255.0 / DIGIT_MAX)).astype(np.uint8)
    image = Image.fromarray(gray, mode="L")
    if size != 8:
        image = image.resize((size, size), resample=Image.Resampling.BILINEAR)
    return image.convert("RGB")


def demo_images() -> list[tuple[Path, str]]:
    """(image path, true label) for every shipped image, read from images/labels.csv."""
    with open(LABELS_CSV, newline="", encoding="utf-8") as fh:
        return [(IMAGES_DIR / row["path"], row["label"]) for row in csv.DictReader(fh)]


__all__ = [
    "CONFIG_PATH",
    "DEMO_DIR",
    "IMAGES_DIR",
    "LABELS_CSV",
    "RENDER_SIZE",
    "WEIGHTS_PATH",
    "demo_images",
    "render_digit",
]
