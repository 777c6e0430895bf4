"""Stage: ``manifest.json`` — every artifact with sha256 and size, the model, preprocessing,
labels, IO spec, batch profile, library versions and each validation's verdict."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..base._deps import available
from ..base._files import write_json_atomic
from ..base.version import __version__
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
    patch_shape: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The manifest's content; ``output``: base/output_spec.ModelOutput (the output tensor's name, and
    ``output_width`` values a row: one per label, or the embedding's dimension); ``patch_shape``: (patches,
    width) of the patch tokens, the io section's ``patch_tokens``, when ``output.patch_tokens``."""
    patch_io = {}
    if output.patch_tokens:
        shape = ["batch", *(int(d) for d in patch_shape or ())]
        patch_io = {"patch_tokens": {"name": output.tensors[1], "dtype": "float32", "shape": shape}}
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "name": name,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": {"vit": dict(vit), "source": dict(source)},
        "output": output.to_dict(),
        "labels": list(labels),
        "preprocess": dict(preprocess),
        "io": {
            "input": {"name": input_name, "dtype": "float32", "shape": ["batch", *chw]},
            "output": {"name": output.tensor, "dtype": "float32", "shape": ["batch", output_width]},
            **patch_io,
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


def read_back(directory: Path) -> None:
    """The export just written, read as `vitdeploy predict` reads it: the manifest through the runtime's
    schema, model.json against it, and every ONNX graph's inputs and outputs against its io section
    (the sha256s were computed from these very files a moment ago). An export never reports success with
    a manifest its own runtime refuses: ExportError naming the refusal."""
    from ..base.errors import ArtifactError, ExportError
    from ..runtime.artifacts import Artifacts, resolve_inside
    from ..runtime.manifest_checks import check_graph_io, check_model_config
    from ..runtime.manifest_schema import read_json_bounded

    try:
        artifacts = Artifacts.open(directory, verify=False)
        schema = artifacts.schema
        where = {role: resolve_inside(directory, e.path, f"artifact {role!r}") for role, e in schema.artifacts.items()}
        if "weights-config" in where:
            path = where["weights-config"]
            check_model_config(schema, read_json_bounded(path, "model config"), path, artifacts.manifest_path)
        for path in where.values():
            if path.suffix == ".onnx":
                inputs, outputs = _graph_io(path)
                check_graph_io(schema, path, inputs, outputs, artifacts.manifest_path, fp16_io_ok=True)
    except ArtifactError as exc:
        raise ExportError(
            f"the export's own runtime refuses what it wrote ({str(exc).splitlines()[0]}); nothing is reported as "
            "exported: this is a vitdeploy bug, please report it with the checkpoint's config"
        ) from exc


def _graph_io(path: Path) -> tuple[list[Any], list[Any]]:
    """(name, dtype, shape) of a graph's inputs and outputs, read without its weights."""
    import onnx

    from ..base.onnx_wire import light_model

    proto = light_model(path)
    names = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}

    def spec(value: Any) -> tuple[str, str, list[Any]]:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        return value.name, names.get(tensor.elem_type, str(tensor.elem_type)), dims

    initializers = {i.name for i in proto.graph.initializer}
    inputs = [spec(v) for v in proto.graph.input if v.name not in initializers]
    return inputs, [spec(v) for v in proto.graph.output]
