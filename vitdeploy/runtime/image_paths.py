"""Which files to read: image paths from files and folders, each bad path kept with its own error.

A folder is walked recursively for image extensions (hidden entries skipped, symlinked folders not
followed); a path that cannot be used (missing, a dangling symlink or a loop, an unreadable folder,
a folder with no images) becomes an error record in place, so one bad path never sinks the others.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..base.errors import InputError

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".png", ".apng", ".jpg", ".jpeg", ".jpe", ".jfif", ".bmp", ".dib", ".gif", ".webp", ".tif", ".tiff"}
)


def is_image_path(path: str | os.PathLike) -> bool:
    """True when ``path``'s extension is one of :data:`IMAGE_EXTENSIONS` (case-insensitive).

    Only the name is looked at; use it to pick files during a directory walk.
    """
    return Path(os.fspath(path)).suffix.lower() in IMAGE_EXTENSIONS


def iter_image_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand ``paths`` into the list of image files to process, in a stable order.

    Files are kept as given (whatever their extension, so a mis-named file still reaches
    :func:`load_image` and fails with a clear message). Directories are walked recursively
    and contribute their files for which :func:`is_image_path` is true, sorted by path;
    hidden files and folders (name starting with ".") are skipped and symlinked folders are
    not followed. Inputs keep their order; nothing is deduplicated.

    Raises :class:`InputError` for the first path that cannot be used (see
    :func:`expand_image_paths`, which reports each instead).
    """
    out: list[Path] = []
    for path, error in expand_image_paths(paths):
        if error is not None:
            raise InputError(error)
        out.append(path)
    return out


def expand_image_paths(paths: Iterable[str | os.PathLike]) -> list[tuple[Path, str | None]]:
    """Like :func:`iter_image_paths`, but a path that cannot be used is kept with its error, in
    place, instead of stopping the rest: ``[(path, None), (bad_path, "why"), ...]``.

    Errors: no such file or directory, a dangling symlink or a symlink loop, a directory that
    cannot be read (or one of its sub-folders), a directory holding no images. A file that
    exists is kept as is (unreadable files fail when decoded, with their own message).
    """
    out: list[tuple[Path, str | None]] = []
    for raw in paths:
        path = Path(os.fspath(raw))
        try:
            st = path.stat()
        except OSError as exc:
            out.append((path, _stat_error(path, exc)))
            continue
        if not stat.S_ISDIR(st.st_mode):
            out.append((path, None))
            continue
        problems: list[OSError] = []
        found = _walk_images(path, problems.append)
        unreadable = [e for e in problems if isinstance(e, OSError)]
        if unreadable and not found:
            exc = unreadable[0]
            out.append((path, f"{exc.filename or path}: cannot read the directory ({exc.strerror or exc})"))
            continue
        out.extend((f, None) for f in found)
        out.extend(
            (
                Path(e.filename or path),
                f"{e.filename or path}: cannot read the directory ({e.strerror or e}); its images were skipped",
            )
            for e in unreadable
        )
        if not found and not unreadable:
            out.append(
                (
                    path,
                    f"{path}: directory holds no images (looked recursively for "
                    f"{', '.join(sorted(IMAGE_EXTENSIONS))}; hidden entries skipped)",
                )
            )
    return out


def _stat_error(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"{path}: symlink loop (too many levels of symbolic links)"
    if isinstance(exc, FileNotFoundError) and path.is_symlink():
        return f"{path}: dangling symlink (its target {os.readlink(path)!r} does not exist)"
    if isinstance(exc, FileNotFoundError):
        return f"{path}: no such file or directory"
    return f"{path}: cannot access ({exc.strerror or exc})"


def _walk_images(root: Path, onerror: Any = None) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fn in filenames:
            if not fn.startswith(".") and is_image_path(fn):
                found.append(Path(dirpath) / fn)
    found.sort()
    return found


__all__ = ["IMAGE_EXTENSIONS", "expand_image_paths", "is_image_path", "iter_image_paths"]
