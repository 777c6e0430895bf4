"""A folder of inputs for batch jobs: the demo images copied into sub-folders, and two that cannot be read."""

from __future__ import annotations

import shutil
from pathlib import Path

from vitdeploy.demo import IMAGES_DIR


def make_collection(root: Path, copies: int) -> Path:
    """The demo images copied ``copies`` times into sub-folders, plus a truncated JPEG and a text file named .png
    (under ``bad/``): a batch job's folder with the inputs that must each get an error row."""
    for copy in range(copies):
        (root / f"c{copy}").mkdir()
        for src in sorted(IMAGES_DIR.iterdir()):
            if src.suffix in (".png", ".jpg"):
                shutil.copy(src, root / f"c{copy}" / src.name)
    jpg = next(IMAGES_DIR.glob("*.jpg")).read_bytes()
    (root / "bad").mkdir()
    (root / "bad" / "truncated.jpg").write_bytes(jpg[: len(jpg) // 3])
    (root / "bad" / "text.png").write_text("hello, not an image\n")
    return root
