"""Stage: trace the ViT to ONNX with a dynamic batch axis, FP32.

Opset >= 17 keeps LayerNorm a single ``LayerNormalization`` node (a decomposed LayerNorm
overflows in FP16 — a known cause of ViT accuracy collapse on TensorRT). Height and width are
fixed to the configured image size; the batch axis is named ``batch``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..base import memory
from ..base._deps import require
from ..base.errors import ExportError, WriteError
from ..base.onnx_wire import is_weight_matrix

log = logging.getLogger(__name__)

INPUT_NAME = "pixel_values"
OUTPUT_NAME = "logits"
BATCH_AXIS = "batch"
#: the image axes' names in a graph exported for several sizes (export.image_sizes)
HEIGHT_AXIS, WIDTH_AXIS = "height", "width"
# Largest batch the exported graph promises to accept (the TensorRT profile narrows it).
MAX_TRACE_BATCH = 4096


@dataclass(frozen=True)
class OnnxArtifact:
    path: Path
    external_data: tuple[Path, ...]  # files beside the graph holding weights (large models)


def export_onnx(
    model: Any,
    path: Path,
    *,
    image_size: int,
    in_channels: int = 3,
    opset: int = 18,
    metadata: dict[str, Any] | None = None,
    external_data_threshold_mb: int = 1536,
    output_name: str | Sequence[str] = OUTPUT_NAME,
    sizes: tuple[int, ...] = (),
    patch_size: int = 0,
) -> OnnxArtifact:
    """Export ``model`` (a torch module: NCHW float32 -> logits, or an embedding named ``output_name``) to
    ``path`` atomically. ``output_name`` may name several outputs, in the order the module returns them (an
    embedding and its patch tokens); each gets the dynamic batch axis.

    ``metadata`` values are JSON-encoded into the ONNX ``metadata_props`` (strings stay strings).
    Weights above ``external_data_threshold_mb`` go to ``<name>.data`` beside the graph.
    ``sizes`` (with ``patch_size``): height and width dynamic too, multiples of the patch spanning these sizes.
    """
    torch = require("torch", "ONNX export")
    require("onnxscript", "ONNX export (torch.onnx dynamo exporter)")
    path = Path(path)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    external = n_bytes > external_data_threshold_mb * 2**20
    model = model.eval()
    example = torch.zeros(2, in_channels, image_size, image_size)
    batch = torch.export.Dim(BATCH_AXIS, min=1, max=MAX_TRACE_BATCH)

    sink = io.StringIO()
    try:
        # The exporter reports its own progress on stdout; the CLI owns the console.
        with contextlib.redirect_stdout(sink), _quiet_exporter(), torch.no_grad():
            program = torch.onnx.export(
                model,
                (example,),
                input_names=[INPUT_NAME],
                output_names=[output_name] if isinstance(output_name, str) else list(output_name),
                dynamic_shapes={"pixel_values": {0: batch, **_image_axes(torch, sizes, patch_size)}},
                opset_version=opset,
                dynamo=True,
                optimize=True,
                verbose=False,
            )
    except Exception as exc:  # noqa: BLE001 - the exporter raises many types
        log.debug("exporter output:\n%s", sink.getvalue())
        raise ExportError(
            f"torch.onnx.export failed for {path.name}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    proto = program.model_proto
    del program
    _forget_last_matches()
    _name_batch_axes(proto)
    set_metadata(proto, metadata or {})
    onnx = require("onnx", "writing ONNX")
    with staged_onnx(path, external=external) as staged:
        _write(proto, staged, external=external, final=path)
        del proto  # the check reads the file back: the graph is not held twice (ViT-L: 1.2 GB)
        memory.give_back()
        _check(staged, onnx)
    log.info("wrote %s (%s)", path, "external data" if external else "single file")
    return _artifact(path, external)


def _image_axes(torch: Any, sizes: tuple[int, ...], patch: int) -> dict[int, Any]:
    """Height and width as multiples of the patch between the smallest and the largest size (none: fixed)."""
    if not sizes:
        return {}
    lo, hi = min(sizes) // patch, max(sizes) // patch
    rows = torch.export.Dim("grid_h", min=max(lo, 2), max=max(hi, 3))
    cols = torch.export.Dim("grid_w", min=max(lo, 2), max=max(hi, 3))
    return {2: patch * rows, 3: patch * cols}


def _forget_last_matches() -> None:
    """Let the exporter's graph go, and the module's weights with it. onnxscript's rewriter rules
    (module-level objects) keep their last match, and through it a graph of the export whose values wrap
    the module's parameters: the eager model's weights outlived the model (measured: all 345 MB of
    ViT-B/16's, after the export had let the model go). The matchers' state is per match (a rule sets it
    again before its next use): it is cleared here, once the serialized graph is made.

    The rules are found from onnxscript's modules (:func:`_rewrite_matchers`), not among the collector's
    objects: those a frozen heap holds (the export's ``gc.freeze``, from a process's second export on; a
    host's own) are invisible to ``gc.get_objects``."""
    for matcher in _rewrite_matchers():
        for name in ("_current_node", "_graph", "_match", "_tracer"):
            if name in vars(matcher):
                setattr(matcher, name, None)


def _rewrite_matchers() -> list[Any]:
    """The pattern matchers of every rewrite rule that onnxscript's imported modules hold (in their
    globals, in lists, tuples, dicts and rule sets): where the rewriter keeps its rules between calls."""
    rules_mod = sys.modules.get("onnxscript.rewriter._rewrite_rule")
    if rules_mod is None:  # the rewriter never ran in this process: nothing it matched
        return []
    rule_type, set_type = rules_mod.RewriteRule, rules_mod.RewriteRuleSet
    modules = [m for name, m in list(sys.modules.items()) if name.startswith("onnxscript.")]
    stack: list[Any] = [m.__dict__ for m in modules if isinstance(getattr(m, "__dict__", None), dict)]
    seen: set[int] = set()
    found: list[Any] = []
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, set_type):
            stack.extend(getattr(obj, "rules", ()))
        elif isinstance(obj, rule_type) and getattr(obj, "_matcher", None) is not None:
            found.append(obj._matcher)
    return found


def save_onnx_atomic(proto: Any, path: Path, *, external: bool, check: bool = True) -> OnnxArtifact:
    """Write ``proto`` to ``path`` (weights to ``<name>.data`` when ``external``) so that no file
    appears under its final name half written (:func:`staged_onnx`), checked first (onnx.checker +
    strict shape inference, path-based so it works past 2 GB) when ``check``."""
    onnx = require("onnx", "writing ONNX")
    with staged_onnx(path, external=external) as staged:
        _write(proto, staged, external=external, final=path)
        if check:
            _check(staged, onnx)
    return _artifact(path, external)


@contextlib.contextmanager
def staged_onnx(path: Path, *, external: bool) -> Iterator[Path]:
    """Where to write the graph ``path`` will be: a temporary folder beside it. On a clean exit the data
    file (``external``) is moved into place first and the graph, which names it, last; a stale ``.data``
    from a larger export goes. On an error nothing is moved, and the folder is removed either way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    data_name = f"{path.name}.data"
    try:
        staged = workdir / path.name
        yield staged
        if external:
            os.replace(workdir / data_name, path.parent / data_name)
        else:
            (path.parent / data_name).unlink(missing_ok=True)
        os.replace(staged, path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _artifact(path: Path, external: bool) -> OnnxArtifact:
    path = Path(path)
    return OnnxArtifact(path, (path.with_name(f"{path.name}.data"),) if external else ())


def _write(proto: Any, staged: Path, *, external: bool, final: Path) -> None:
    """``proto`` into ``staged`` (its weights into ``<name>.data`` beside it when ``external``);
    WriteError when the disk refuses, ExportError for anything else (both naming ``final``)."""
    onnx = require("onnx", "writing ONNX")
    try:
        if external:
            onnx.save_model(
                proto,
                str(staged),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=f"{staged.name}.data",
                size_threshold=1024,
            )
        else:
            write_streamed(proto, staged)
    except OSError as exc:
        if exc.errno in WriteError.ERRNOS:
            raise WriteError.from_os(exc, final) from exc
        raise ExportError(f"cannot write {final}: {exc}") from exc
    except ValueError as exc:
        raise ExportError(f"cannot write {final}: {exc}") from exc


def write_streamed(proto: Any, path: Path, weights: dict[str, Any] | None = None, data: Path | None = None) -> None:
    """``proto`` serialized to ``path`` one weight at a time: the graph without its initializers first,
    then each initializer as a message of its own. Protobuf merges repeated occurrences of an embedded
    message (the graph), appending their repeated fields, so the file parses as the one model
    ``proto`` is (tested byte for byte against onnx.save_model's file, loaded), while memory holds one
    tensor's bytes beside the graph instead of a serialized copy of every weight.

    ``weights`` (name -> TensorProto): written in place of ``proto``'s initializers of those names, so
    a graph worked on without its weights (:func:`without_weights`) is written with them, uncopied.

    ``data``: the external data file beside ``path`` (a graph past protobuf's 2 GB, or past
    ``export.external_data_threshold_mb``): each initializer of 1 KB or more is appended to it as it is
    written, and the graph names it by its file name, offset and length."""
    onnx = require("onnx", "writing ONNX")
    head = onnx.ModelProto()
    for field, value in proto.ListFields():
        if field.name != "graph":
            _copy_field(head, field, value)
    for field, value in proto.graph.ListFields():
        if field.name != "initializer":
            _copy_field(head.graph, field, value)
    with open(path, "wb") as out, contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(data, "wb")) if data is not None else None
        out.write(head.SerializeToString())
        for tensor in proto.graph.initializer:
            chunk = onnx.ModelProto()
            written = chunk.graph.initializer.add()
            written.CopyFrom((weights or {}).get(tensor.name, tensor))
            if sink is not None:
                _to_external(written, sink, data.name, onnx)
            out.write(chunk.SerializeToString())


def _to_external(tensor: Any, sink: Any, location: str, onnx: Any) -> None:
    """Move ``tensor``'s bytes (1 KB or more) to the end of the open data file ``sink`` (named ``location``
    beside the graph), leaving in the tensor where they are, as onnx.save_model's external data does."""
    from onnx import external_data_helper, numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise ExportError(f"{tensor.name}: an external tensor cannot be written again without its data")
    raw = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
    if len(raw) < 1024:
        return
    offset = sink.tell()
    sink.write(raw)
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
    tensor.raw_data = b"\0"  # onnx's helper asks for the field it is about to replace
    external_data_helper.set_external_data(tensor, location, offset, len(raw))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")


def _copy_field(dst: Any, field: Any, value: Any) -> None:
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
    if repeated:
        getattr(dst, field.name).extend(value)
    elif field.message_type:
        getattr(dst, field.name).CopyFrom(value)
    else:
        setattr(dst, field.name, value)


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Only errors from the named loggers while inside (libraries chatty at INFO / WARNING)."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's own warnings (e.g. about torchvision ops a ViT never uses)."""
    with quiet_loggers("torch.onnx"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _name_batch_axes(proto: Any) -> None:
    """Name the leading axis of every graph input/output ``batch`` (the exporter may call it s0), and the
    input's image axes ``height`` / ``width`` where they are dynamic."""
    for value in list(proto.graph.input) + list(proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_param = BATCH_AXIS
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        for index, name in ((2, HEIGHT_AXIS), (3, WIDTH_AXIS)):
            if len(dims) > index and not dims[index].HasField("dim_value"):
                dims[index].dim_param = name


def set_metadata(proto: Any, metadata: dict[str, Any]) -> None:
    """Set ONNX ``metadata_props``; non-string values are JSON-encoded."""
    existing = {p.key: p for p in proto.metadata_props}
    for key, value in metadata.items():
        text = value if isinstance(value, str) else json.dumps(value)
        if key in existing:
            existing[key].value = text
        else:
            prop = proto.metadata_props.add()
            prop.key, prop.value = key, text


def _check(path: Path, onnx: Any) -> None:
    """onnx.checker and strict shape inference must pass (path-based: works past 2 GB)."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"exported graph {path.name} fails onnx.checker / shape inference: {exc}") from exc


def without_weights(model: Any) -> Any:
    """A copy of the graph for shape inference whose weight matrices (2-D initializers, nearly all of a
    ViT's bytes) keep their dims but not their bytes: a ViT-H graph is not copied with its 2.4 GB of
    weights. Every other initializer stays whole (shapes and axes for Reshape; the position table and
    class token, which symbolic shape inference reads), and every other field (metadata, names)."""
    onnx = require("onnx", "ONNX shape inference")
    light = onnx.ModelProto()
    for field, value in model.ListFields():  # everything but the weights: names, metadata, opsets
        if field.name != "graph":
            _copy_field(light, field, value)
    graph = light.graph
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(graph, field, value)
    for t in model.graph.initializer:
        if is_weight_matrix(t.dims):
            graph.initializer.add(name=t.name, dims=t.dims, data_type=t.data_type)
        else:
            graph.initializer.add().CopyFrom(t)
    return light


def read_metadata(path: Path) -> dict[str, str]:
    from ..base.onnx_wire import light_model

    proto = light_model(path)
    return {p.key: p.value for p in proto.metadata_props}
