"""What a path is: which format's reader claims it, which weight files and config belong to it.

Formats are recognised from the contents, not the names: a directory by the config file a reader
claims (vitdeploy's model.json, Hugging Face's or timm's config.json), a weights file by its
neighbours or, alone, by its tensor names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from ...base.errors import CheckpointError
from . import READERS
from .base import Reader, Source
from .shared import read_json, shorten, weight_keys

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


def resolve_source(path: Path) -> Source:
    path = path.expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory; give a checkpoint file or directory")
    if path.is_dir():
        return _resolve_dir(path)
    if path.suffix == ".json":  # a config file given itself: the checkpoint it describes
        meta = read_json(path)
        for reader in READERS.values():
            # config.json is claimed by loose keys, so only under its own name; a file that states its
            # format (vitdeploy's "format": "vitdeploy") is claimed whatever its name
            named = path.name == reader.meta_file or reader.meta_file != "config.json"
            if reader.meta_file and named and reader.claims_meta(meta):
                return reader.open_meta(path, meta)
        if path.name == "config.json":
            return _resolve_dir(path.parent, only="config.json")
        raise CheckpointError(f"{path}: a JSON file that is neither a vitdeploy model.json nor a config.json")
    return _resolve_file(path)


def _meta_files(only: str | None = None) -> Iterator[tuple[str, list[Reader]]]:
    """(config file name, the readers that read it), in registry order."""
    names = dict.fromkeys(r.meta_file for r in READERS.values() if r.meta_file and only in (None, r.meta_file))
    for name in names:
        yield name, [r for r in READERS.values() if r.meta_file == name]  # type: ignore[misc]


def _resolve_dir(d: Path, only: str | None = None) -> Source:
    unclaimed = []
    for name, readers in _meta_files(only):
        meta_path = d / name
        if not meta_path.is_file():
            continue
        meta = read_json(meta_path)
        for reader in readers:
            if reader.claims_meta(meta):
                return reader.open_meta(meta_path, meta)
        unclaimed.append((meta_path, readers))
    for meta_path, readers in unclaimed:
        if meta_path.name == "config.json":  # a model.json of something else is just another file
            raise CheckpointError(f"{meta_path}: not {' nor '.join(r.meta_hint for r in readers)}")
    candidates = sorted(p for p in d.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if len(candidates) == 1:
        return _resolve_file(candidates[0])
    raise CheckpointError(
        f"{d}: not a checkpoint directory: no model.json (vitdeploy) or config.json (Hugging Face / timm)"
        + (
            f", and {len(candidates)} weight files ({shorten(p.name for p in candidates)}); give one file"
            if candidates
            else ", and no weights file"
        )
    )


def _resolve_file(path: Path) -> Source:
    for name, readers in _meta_files():  # a weights file inside a checkpoint directory
        meta_path = path.parent / name
        if not meta_path.is_file():
            continue
        meta = read_json(meta_path)
        for reader in readers:
            if reader.claims_meta(meta):
                src = reader.open_file(path, meta)
                if src is not None:
                    return src
    return resolve_weights(path)


def resolve_weights(path: Path) -> Source:
    """A weights file on its own, recognised by its tensor names."""
    keys, state = weight_keys(path)
    for reader in READERS.values():
        if reader.claims_keys(keys, path):
            return Source(reader.format, path, [path], state=state, name=path.stem)
    raise CheckpointError(
        f"{path}: unknown checkpoint format: the keys match none of timm (patch_embed.proj, blocks.N), "
        f"torchvision (conv_proj, encoder.layers), Hugging Face or vitdeploy; first keys: {shorten(keys, 6)}"
    )
