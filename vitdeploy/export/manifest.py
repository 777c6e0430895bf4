"""Stage: ``manifest.json`` — every artifact with sha256 and size, the model, preprocessing,
labels, IO spec, batch profile, library versions and each validation's verdict."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import __version__
from ..base._deps import available
from ..base._files import write_json_atomic
from ..runtime.artifacts import MANIFEST_FORMAT, MANIFEST_NAME, MANIFEST_VERSION, sha256_file


def file_entry(path: Path, root: Path, external: Sequence[Path] = ()) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "path": path.relative_to(root).as_posix(),
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
    }
    if external:
        entry["external_data"] = [
            {"path": p.relative_to(root).as_posix(), "sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in external
        ]
    return entry


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"vitdeploy": __version__}
    for module in ("torch", "onnx", "onnxruntime", "tensorrt", "numpy", "PIL"):
        ok, version = available(module)
        versions[module] = version if ok else None
    return versions


def build_manifest(
    *,
    name: str,
    vit: Mapping[str, Any],
    source: Mapping[str, Any],
    labels: Sequence[str],
    preprocess: Mapping[str, Any],
    input_name: str,
    output: Any,
    output_width: int,
    chw: Sequence[int],
    batch: Mapping[str, int],
    artifacts: Mapping[str, dict[str, Any]],
    validation: Mapping[str, Any],
    stages: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest's content; ``output``: base/output_spec.ModelOutput (the output tensor's name, and
    ``output_width`` values a row: one per label, or the embedding's dimension)."""
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "name": name,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": {"vit": dict(vit), "source": dict(source)},
        "output": output.model_dump(),
        "labels": list(labels),
        "preprocess": dict(preprocess),
        "io": {
            "input": {"name": input_name, "dtype": "float32", "shape": ["batch", *chw]},
            "output": {"name": output.tensor, "dtype": "float32", "shape": ["batch", output_width]},
        },
        "batch": dict(batch),
        "artifacts": dict(artifacts),
        "versions": library_versions(),
        "validation": dict(validation),
        "stages": [dict(s) for s in stages],
        **(dict(extra) if extra else {}),
    }


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> Path:
    return write_json_atomic(directory / MANIFEST_NAME, manifest)
