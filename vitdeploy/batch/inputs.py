"""Which images a batch job reads: files, folders, globs, list files and URIs, each bad one kept with its error.

    items = expand_inputs(["photos/", "more/*.jpg", "list.txt", "s3://bucket/night/"])
    # [Item(path="photos/a.jpg", read="/abs/photos/a.jpg", error=None), ..., Item(path="gone.jpg", error="...")]

``path`` is what the user sees in the output (spelled as ``predict`` spells it: local paths as
given or as listed, URIs as URIs); ``read`` is what Ray Data's binary-file reader opens (an
absolute local path, or the URI). Local files and folders go through ``predict``'s own discovery
(:func:`~vitdeploy.runtime.image_paths.expand_image_paths`), so a folder yields the same files in
the same order. A URI (``file://``, ``s3://``, ``gs://``, anything pyarrow's filesystems open) is a
file, a folder (walked recursively for image extensions, hidden entries skipped) or a glob.

List files: ``.txt`` (one path a line; blank lines and ``#`` comments skipped), ``.csv`` and
``.parquet`` (a ``path`` column). Relative entries resolve against the list file's folder. An input
listed twice (the same file to read) is read once.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import posixpath
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterable

from ..base._deps import require
from ..base.errors import InputError
from ..runtime.image_paths import IMAGE_EXTENSIONS, expand_image_paths, is_image_path

LIST_SUFFIXES = (".txt", ".csv", ".parquet")
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Item:
    """One input: ``path`` as shown in the output, ``read`` as opened, ``error`` when it cannot be used."""

    path: str
    read: str
    error: str | None = None


def is_uri(text: str) -> bool:
    head, sep, _ = text.partition("://")
    return bool(sep) and head.isidentifier()


def read_key(read: str) -> str:
    """The path Ray Data's binary-file reader reports for ``read`` (the URI scheme dropped)."""
    return read.partition("://")[2] if is_uri(read) else read


def expand_inputs(inputs: Iterable[str | os.PathLike[str]]) -> list[Item]:
    """Every image to read under ``inputs``, in order, each distinct file once; bad inputs keep their error."""
    out: list[Item] = []
    for raw in inputs:
        text = os.fspath(raw)
        if text.lower().endswith(LIST_SUFFIXES) and _is_file(text):
            for entry in _read_list(text):
                out.extend(_expand_one(entry))
        else:
            out.extend(_expand_one(text))
    seen: set[str] = set()
    unique = []
    for item in out:
        key = item.read if item.error is None else f"\0{item.path}\0{item.error}"
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return unique


def _has_glob(text: str) -> bool:
    return any(c in _GLOB_CHARS for c in text)


def _expand_one(text: str) -> list[Item]:
    if is_uri(text):
        return _expand_uri(text)
    if _has_glob(text) and not os.path.lexists(text):
        matches = sorted(glob.glob(text, recursive=True))
        if not matches:
            return [Item(text, text, f"{text}: no file matches the pattern")]
        return _local(matches)
    return _local([text])


def _local(paths: list[str]) -> list[Item]:
    return [Item(str(p), str(Path(p).absolute()), err) for p, err in expand_image_paths(paths)]


# ------------------------------------------------------------------------------------------------
# URIs through pyarrow's filesystems


def _filesystem(uri: str) -> tuple[Any, str]:
    fs_mod = require("pyarrow.fs", f"reading {uri}")
    try:
        return fs_mod.FileSystem.from_uri(uri)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{uri}: cannot open this URI ({str(exc).splitlines()[0]}); supported: file://, s3://, "
            "gs:// and the other schemes pyarrow.fs opens"
        ) from None


def _shown(scheme: str, fs_path: str) -> str:
    return f"{scheme}://{fs_path}" if fs_path.startswith("/") or scheme != "file" else f"{scheme}:///{fs_path}"


def _uri_item(scheme: str, fs_path: str) -> Item:
    shown = _shown(scheme, fs_path)
    return Item(shown, fs_path if scheme == "file" else shown)


def _expand_uri(uri: str) -> list[Item]:
    scheme = uri.partition("://")[0]
    fs_mod = require("pyarrow.fs", f"reading {uri}")
    fs, base = _filesystem(uri)
    if _has_glob(base):
        return _glob_uri(fs, fs_mod, scheme, uri, base)
    try:
        info = fs.get_file_info(base)
    except OSError as exc:
        return [Item(uri, uri, f"{uri}: cannot access ({str(exc).splitlines()[0]})")]
    if info.type == fs_mod.FileType.NotFound:
        return [Item(uri, uri, f"{uri}: no such file or directory")]
    if info.type != fs_mod.FileType.Directory:
        return [Item(uri, base if scheme == "file" else uri)]
    found = _walk_uri(fs, fs_mod, uri, base)
    if isinstance(found, Item):
        return [found]
    if not found:
        return [
            Item(
                uri,
                uri,
                f"{uri}: directory holds no images (looked recursively for "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}; hidden entries skipped)",
            )
        ]
    return [_uri_item(scheme, p) for p in found]


def _walk_uri(fs: Any, fs_mod: Any, uri: str, base: str) -> list[str] | Item:
    try:
        infos = fs.get_file_info(fs_mod.FileSelector(base, recursive=True))
    except OSError as exc:
        return Item(uri, uri, f"{uri}: cannot read the directory ({str(exc).splitlines()[0]})")
    root = base.rstrip("/")
    found = []
    for info in infos:
        rel = info.path[len(root) :].lstrip("/")
        if (
            info.type == fs_mod.FileType.File
            and is_image_path(rel)
            and not any(part.startswith(".") for part in rel.split("/"))
        ):
            found.append(info.path)
    return sorted(found)


def _glob_uri(fs: Any, fs_mod: Any, scheme: str, uri: str, pattern: str) -> list[Item]:
    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if _has_glob(part))
    base = "/".join(parts[:fixed]) or "/"
    try:
        infos = fs.get_file_info(fs_mod.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as exc:
        return [Item(uri, uri, f"{uri}: cannot list {base} ({str(exc).splitlines()[0]})")]
    out = [
        _uri_item(scheme, info.path)
        for info in sorted(infos, key=lambda i: i.path)
        if info.type == fs_mod.FileType.File
        and fnmatchcase(info.path, pattern)
        and not posixpath.basename(info.path).startswith(".")
    ]
    return out or [Item(uri, uri, f"{uri}: no file matches the pattern")]


# ------------------------------------------------------------------------------------------------
# list files


def _is_file(text: str) -> bool:
    if not is_uri(text):
        return os.path.isfile(text)
    fs_mod = require("pyarrow.fs", f"reading {text}")
    fs, base = _filesystem(text)
    try:
        return fs.get_file_info(base).type == fs_mod.FileType.File
    except OSError:
        return False


def _read_bytes(text: str) -> bytes:
    try:
        if not is_uri(text):
            return Path(text).read_bytes()
        fs, base = _filesystem(text)
        with fs.open_input_stream(base) as fh:
            return fh.read()
    except OSError as exc:
        raise InputError(f"{text}: cannot read the list file ({getattr(exc, 'strerror', None) or exc})") from None


def _read_list(text: str) -> list[str]:
    """The entries of a list file, relative ones resolved against the list's folder."""
    data = _read_bytes(text)
    suffix = text.lower().rsplit(".", 1)[-1]
    if suffix == "parquet":
        entries = _parquet_paths(text, data)
    else:
        try:
            decoded = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{text}: not UTF-8 text ({exc.reason} at byte {exc.start}); a list file holds one "
                "path a line (.txt) or a 'path' column (.csv, .parquet)"
            ) from None
        entries = (
            _csv_paths(text, decoded)
            if suffix == "csv"
            else [line.strip() for line in decoded.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        )
    folder = text.rsplit("/", 1)[0] if is_uri(text) else os.path.dirname(text)
    return [
        e
        if is_uri(e) or os.path.isabs(e) or not folder
        else (f"{folder}/{e}" if is_uri(text) else os.path.join(folder, e))
        for e in entries
    ]


def _csv_paths(text: str, decoded: str) -> list[str]:
    reader = csv.DictReader(io.StringIO(decoded))
    if "path" not in (reader.fieldnames or []):
        raise InputError(
            f"{text}: no 'path' column (columns: {', '.join(reader.fieldnames or []) or 'none'}); "
            "a CSV list file needs a header row with a 'path' column"
        )
    return [row["path"].strip() for row in reader if (row.get("path") or "").strip()]


def _parquet_paths(text: str, data: bytes) -> list[str]:
    pq = require("pyarrow.parquet", f"reading {text}")
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise InputError(f"{text}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    if "path" not in table.column_names:
        raise InputError(f"{text}: no 'path' column (columns: {', '.join(table.column_names) or 'none'})")
    return [str(p).strip() for p in table.column("path").to_pylist() if p is not None and str(p).strip()]


__all__ = ["Item", "LIST_SUFFIXES", "expand_inputs", "is_uri", "read_key"]
