"""Where the embedded demo model and its held-out images live (shipped inside the package)."""

from .demo import DEMO_DIR as DEMO_MODEL_DIR
from .demo import IMAGES_DIR as DEMO_IMAGES_DIR
from .demo import LABELS_CSV as DEMO_LABELS_CSV

__all__ = ["DEMO_IMAGES_DIR", "DEMO_LABELS_CSV", "DEMO_MODEL_DIR"]
