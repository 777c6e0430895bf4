"""Where the embedded demo model and its held-out images live (shipped inside the package)."""

from pathlib import Path

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "demo"
DEMO_IMAGES_DIR = DEMO_MODEL_DIR / "images"
DEMO_LABELS_CSV = DEMO_IMAGES_DIR / "labels.csv"
