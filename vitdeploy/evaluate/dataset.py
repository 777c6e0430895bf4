"""The validation set ``validate`` judges backends on: image files and, where known, their true labels.

The shipped demo images by default, or a folder of the user's with labels from a CSV or from
sub-folder names; :func:`label_indices` maps true labels to the model's classes.
"""

from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..base.errors import InputError

log = logging.getLogger(__name__)

_LABEL_HEADER = ("path", "label")


@dataclass(frozen=True)
class ValidationSet:
    """Image files to validate on, and the true label of each (None where unknown)."""

    paths: tuple[Path, ...]
    labels: tuple[str | None, ...]
    source: str  # the folder (or CSV) the images came from
    label_source: str  # "csv:<file>", "sub-folders" or "none"
    unmatched_labels: tuple[str, ...] = ()  # CSV rows naming no image in the set

    @property
    def labelled(self) -> int:
        return sum(label is not None for label in self.labels)


def read_labels_csv(path: str | os.PathLike[str]) -> list[tuple[str, str, int]]:
    """Rows of a labels CSV as (path, label, line number).

    The file has a ``path,label`` header (other columns are ignored) or no header and the path
    and label in the first two columns. InputError names the file and line for anything else.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise InputError(
            f"labels file {path} {what}; expected a CSV file with a header 'path,label' and one row per "
            f"image (path relative to the CSV's folder or the images folder), or leave --labels out to "
            f"take labels from sub-folder names"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"labels file {path}: cannot read it as UTF-8 text ({exc})") from exc
    rows = list(csv.reader(text.splitlines()))
    numbered = [(i + 1, [c.strip() for c in row]) for i, row in enumerate(rows) if any(c.strip() for c in row)]
    if not numbered:
        raise InputError(f"labels file {path} is empty; expected a header 'path,label' and one row per image")
    path_col, label_col = 0, 1
    header = [c.lower() for c in numbered[0][1]]
    if "path" in header and "label" in header:
        path_col, label_col = header.index("path"), header.index("label")
        numbered = numbered[1:]
    elif any(c in header for c in _LABEL_HEADER):
        raise InputError(
            f"labels file {path} line {numbered[0][0]}: header {numbered[0][1]} must name both a 'path' "
            f"and a 'label' column"
        )
    out = []
    for line, row in numbered:
        if len(row) <= max(path_col, label_col) or not row[path_col] or not row[label_col]:
            raise InputError(f"labels file {path} line {line}: expected a path and a label, got {row}")
        out.append((row[path_col], row[label_col], line))
    return out


def _key(path: Path) -> str:
    return os.path.normcase(str(path.resolve()))


def load_validation_set(
    images: str | os.PathLike[str] | None = None, labels_file: str | os.PathLike[str] | None = None
) -> ValidationSet:
    """Which images to validate on and their labels.

    * nothing given: the shipped demo images with their labels.csv;
    * ``labels_file`` only: the images the CSV lists (paths relative to the CSV's folder);
    * ``images`` (a folder, or one file): every image in it (walked recursively); labels from
      ``labels_file`` (paths relative to the CSV's folder or to ``images``), else from a
      ``labels.csv`` in the folder, else from each image's first-level sub-folder name
      (``images/cat/1.jpg`` is a "cat"; images directly in the folder are unlabelled).

    InputError for a folder with no images, a missing or malformed labels file.
    """
    from ..demo import IMAGES_DIR as DEMO_IMAGES_DIR
    from ..demo import LABELS_CSV as DEMO_LABELS_CSV
    from ..runtime.image_paths import iter_image_paths

    if images is None and labels_file is None:
        if not DEMO_IMAGES_DIR.is_dir():
            raise InputError(
                f"the demo images are missing ({DEMO_IMAGES_DIR}); reinstall vitdeploy or pass --images DIR"
            )
        images = DEMO_IMAGES_DIR
        labels_file = DEMO_LABELS_CSV if DEMO_LABELS_CSV.is_file() else None

    if images is None:  # the CSV alone says which images
        csv_path = Path(labels_file)  # type: ignore[arg-type]
        rows = read_labels_csv(csv_path)
        paths = tuple(_resolve_row(p, [csv_path.parent]) for p, _, _ in rows)
        return ValidationSet(paths, tuple(label for _, label, _ in rows), str(csv_path), f"csv:{csv_path}")

    root = Path(images)
    if not root.exists():
        raise InputError(f"--images {root}: no such file or directory")
    paths = tuple(iter_image_paths([root]))
    if labels_file is None and root.is_dir() and (root / "labels.csv").is_file():
        labels_file = root / "labels.csv"

    if labels_file is not None:
        csv_path = Path(labels_file)
        rows = read_labels_csv(csv_path)
        index = {_key(p): i for i, p in enumerate(paths)}
        bases = [csv_path.parent] + ([root] if root.is_dir() else [])
        labels: list[str | None] = [None] * len(paths)
        unmatched = []
        for rel, label, line in rows:
            hit = next((index[k] for k in (_key(_resolve_row(rel, [b])) for b in bases) if k in index), None)
            if hit is None:
                unmatched.append(rel)
                continue
            labels[hit] = label
        if unmatched:
            log.warning(
                "%s: %d row(s) name no image under %s (first: %s)", csv_path, len(unmatched), root, unmatched[0]
            )
        if rows and len(unmatched) == len(rows):
            raise InputError(
                f"labels file {csv_path}: none of its {len(rows)} paths (e.g. {rows[0][0]!r}) is an image "
                f"under {root}; paths must be relative to the CSV's folder or to the images folder"
            )
        return ValidationSet(paths, tuple(labels), str(root), f"csv:{csv_path}", tuple(unmatched))

    if root.is_dir():
        labels = [_subfolder_label(p, root) for p in paths]
        if any(label is not None for label in labels):
            return ValidationSet(paths, tuple(labels), str(root), "sub-folders")
    return ValidationSet(paths, (None,) * len(paths), str(root), "none")


def _resolve_row(rel: str, bases: Sequence[Path]) -> Path:
    candidate = Path(rel).expanduser()
    if candidate.is_absolute():
        return candidate
    for base in bases:
        if (base / candidate).exists():
            return base / candidate
    return bases[0] / candidate


def _subfolder_label(path: Path, root: Path) -> str | None:
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 else None


def label_indices(labels: Sequence[str | None], classes: Sequence[str]) -> tuple[list[int | None], list[str]]:
    """True labels -> class indices of the model (None where unknown) and the labels that are no
    class of the model. A label matches a class name exactly, or else is a class index ("3")."""
    lookup = {name: i for i, name in enumerate(classes)}
    out: list[int | None] = []
    unknown: list[str] = []
    for label in labels:
        if label is None:
            out.append(None)
        elif label in lookup:
            out.append(lookup[label])
        elif label.strip().isdigit() and int(label) < len(classes):
            out.append(int(label))
        else:
            out.append(None)
            unknown.append(label)
    return out, unknown


__all__ = ["ValidationSet", "label_indices", "load_validation_set", "read_labels_csv"]
