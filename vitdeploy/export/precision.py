"""Stage: the FP16 graph TensorRT compiles (``model.fp16.onnx``).

Mixed precision with float32 inputs and outputs, through onnxconverter-common's maintained
float16 converter. Kept in float32:
- every op type in ``keep_fp32_ops`` (LayerNormalization by default: its variance overflows);
- every node whose output, on the calibration batch, exceeds ``max_abs_activation`` in
  magnitude (FP16's largest finite value is 65504; the default margin leaves room for inputs
  hotter than the calibration set);
- every node of ``keep_fp32_nodes``: what the FP16 autopilot (export/autopilot.py) returned to
  float32 to meet validation.fp16.

Two habits of the converter would round float32 nodes through FP16 anyway, and are undone:
its shape inference types an initializer as FLOAT16 when the graph carries a value_info for it
(dynamo-exported graphs do), so the weights of float32 nodes were stored in FP16 (value_infos
naming initializers are dropped before converting, and an initializer read by float32 and FP16
nodes alike gets a float32 copy for the float32 ones, since the converter keeps a shared one
float32 for all); and it casts every float32 node's output to
FP16, where a float32 consumer casts it back (a value with more than one consumer keeps that
round trip): a Cast to FLOAT reading a Cast to FLOAT16 reads the float32 value instead, and a Cast
left without consumers is removed. And when the node writing a graph output is kept float32, the
converter makes that output FLOAT16 despite ``keep_io_types``: its Cast is turned back to FLOAT.
So a node kept float32 reads and writes float32 between float32 neighbours, up to the graph's
float32 output.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..base._deps import require
from ..base.errors import ExportError
from ..base.onnx_wire import in_place_model, is_weight_matrix, light_model
from .onnx import staged_onnx, without_weights, write_streamed

log = logging.getLogger(__name__)

#: what the converter is told: FP16's largest finite value (weights beyond it are clamped, not inf), and
#: its own default for the smallest magnitude kept (smaller ones are clamped to it, not flushed to zero)
_FP16_MAX, _FP16_MIN_POSITIVE = 65504.0, 1e-7


@dataclass(frozen=True)
class Fp16Result:
    path: Path
    kept_op_types: tuple[str, ...]
    kept_hot_nodes: tuple[str, ...]  # nodes kept float32 because their activations ran hot
    activation_peaks: dict[str, float] = field(default_factory=dict)  # hottest few node outputs
    keep_float: tuple[str, ...] = ()  # every node name asked to stay float32 (floor and autopilot)

    def summary(self) -> dict[str, Any]:
        return {
            "kept_fp32_op_types": list(self.kept_op_types),
            "kept_fp32_hot_nodes": list(self.kept_hot_nodes),
            "activation_peaks": self.activation_peaks,
            "keep_float": list(self.keep_float),
        }


def hot_nodes(peaks: dict[str, float], max_abs_activation: float) -> list[str]:
    """The nodes whose outputs exceed ``max_abs_activation`` (or are not finite), sorted."""
    return sorted(node for node, peak in peaks.items() if not np.isfinite(peak) or peak > max_abs_activation)


def activation_peaks(
    onnx_path: Path, calibration: np.ndarray, input_name: str, batch: int | None = None
) -> dict[str, float]:
    """Max |value| of every float node output over ``calibration``, by producing node name (inf when a
    value is not finite: NaN or inf is always hot), reduced inside ONNX Runtime as the runs stream
    (export/probe.py: what a run holds is what inference holds, the weights once)."""
    onnx = require("onnx", "FP16 calibration")
    from .probe import FP16_BATCH, float_values, reduce_values

    model = in_place_model(onnx_path)  # its weights read by ONNX Runtime where they lie: not parsed, not copied
    floats = {v for v, t in float_values(model).items() if t == onnx.TensorProto.FLOAT}
    producers = {out: node.name for node in model.graph.node for out in node.output if out in floats}
    wanted = {value: ("min", "max", "sum") for value in producers}
    peaks: dict[str, float] = {}
    try:
        runs = reduce_values(onnx_path, calibration, input_name, wanted, batch=batch or FP16_BATCH, model=model)
        for run in runs:
            for value, stat in run.items():
                finite = np.isfinite(stat["sum"])
                peak = max(-stat["min"], stat["max"]) if finite else float("inf")
                peaks[producers[value]] = max(peaks.get(producers[value], 0.0), peak)
    except ExportError as exc:
        raise ExportError(f"FP16 calibration of {onnx_path.name} failed: {exc}") from exc
    return peaks


def shape_only_nodes(onnx_path: Path) -> list[str]:
    """Nodes computed from the weights and the input's shape alone, never its pixels: an export for several
    sizes builds its position table there (model/pos_resample.py: index arithmetic and a resampling in
    float32, as the libraries do). They stay float32 and out of INT8 (a float16 Range is not even valid ONNX)."""
    require("onnx", "reading ONNX")
    graph = light_model(onnx_path).graph
    pixels = {i.name for i in graph.input}
    for node in graph.node:  # topological order
        if node.op_type != "Shape" and any(name in pixels for name in node.input):
            pixels.update(node.output)
    dynamic = any(not d.HasField("dim_value") for i in graph.input for d in i.type.tensor_type.shape.dim[2:])
    if not dynamic:  # a fixed-size graph has no such subgraph worth keeping (its folded constants stay as they are)
        return []
    return [n.name for n in graph.node if n.name and not any(o in pixels for o in n.output)]


def convert_fp16(
    onnx_path: Path,
    out_path: Path,
    *,
    calibration: np.ndarray,
    input_name: str = "pixel_values",
    keep_fp32_ops: Sequence[str] = ("LayerNormalization",),
    max_abs_activation: float = 4096.0,
    keep_fp32_nodes: Sequence[str] = (),
    peaks: dict[str, float] | None = None,
    external_data_threshold_mb: int = 1536,
) -> Fp16Result:
    """Write the mixed-precision graph of ``onnx_path`` to ``out_path`` atomically.

    ``peaks``: :func:`activation_peaks` of ``onnx_path`` on ``calibration`` when already known.
    ``external_data_threshold_mb``: above this many MB of FP16 weights (estimated: half the source's), they go
    to ``<out_path>.data`` beside the graph (export.external_data_threshold_mb; protobuf stops at 2 GB)."""
    onnx = require("onnx", "FP16 conversion")
    float16 = require("onnxconverter_common.float16", "FP16 conversion")
    if peaks is None:
        peaks = activation_peaks(onnx_path, calibration, input_name)
    hot = hot_nodes(peaks, max_abs_activation)
    blocked = sorted(set(hot) | set(keep_fp32_nodes) | set(shape_only_nodes(onnx_path)))
    if hot:
        log.info(
            "keeping %d hot nodes in float32 (|activation| > %g): %s",
            len(hot),
            max_abs_activation,
            ", ".join(hot[:10]),
        )
    # The converter works on the graph without its weight matrices (nearly all of a ViT's bytes): it
    # only retypes them. Each is converted (or kept float32) as it is written, one at a time, so memory
    # holds the source's weights once, not their FP16 copies, a serialized copy and a reloaded one too.
    source = in_place_model(onnx_path)  # the weights stay on disk (inline or external), read one at a time below
    float_outputs = {o.name for o in source.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    model = without_weights(source)
    # the converter's own shape inference would copy the model: inferred here once, without the weights
    inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred)
    del inferred
    _drop_initializer_value_info(model.graph)
    copies = _unshare_initializers(model.graph, lambda n: n.op_type in set(keep_fp32_ops) or n.name in set(blocked))
    with warnings.catch_warnings(record=True) as clamped:  # one warning per constant clamped to FP16's range
        warnings.simplefilter("always", UserWarning)
        try:
            converted = float16.convert_float_to_float16(
                model,
                keep_io_types=True,
                op_block_list=list(keep_fp32_ops),
                node_block_list=blocked,
                max_finite_val=_FP16_MAX,
                disable_shape_infer=True,
            )
        except Exception as exc:  # noqa: BLE001
            raise ExportError(f"FP16 conversion of {onnx_path.name} failed: {type(exc).__name__}: {exc}") from exc
        _drop_fp16_round_trips(converted.graph, onnx.TensorProto)
        _float_outputs(converted.graph, float_outputs, onnx.TensorProto)
        external = _fp16_bytes(source) > external_data_threshold_mb * 2**20
        weights = _WeightsAsConverted(source, onnx_path, converted.graph, copies, float16)
        with staged_onnx(out_path, external=external) as tmp:
            write_streamed(converted, tmp, weights, tmp.with_name(f"{tmp.name}.data") if external else None)
            del weights, source
            try:
                onnx.checker.check_model(str(tmp), full_check=True)
            except Exception as exc:  # noqa: BLE001
                raise ExportError(f"FP16 graph {out_path.name} fails onnx.checker: {exc}") from exc
    if clamped:
        log.info("FP16 conversion clamped %d float32 constants to FP16's range", len(clamped))
    top = dict(sorted(peaks.items(), key=lambda kv: -kv[1])[:5])
    kept = tuple(n.name for n in model.graph.node if n.op_type in set(keep_fp32_ops) or n.name in set(blocked))
    return Fp16Result(out_path, tuple(keep_fp32_ops), tuple(hot), {k: round(v, 3) for k, v in top.items()}, kept)


class _WeightsAsConverted:
    """The weights the converter saw without their bytes (weight matrices, and any initializer kept in
    external data), each made as the converted graph types it when :func:`write_streamed` asks for it:
    read from the source graph ``graph`` (where they lie in it, or in its external data file), converted with
    the converter's own tensor conversion when it became FLOAT16. Every other initializer is the converted
    graph's own."""

    def __init__(self, source: Any, graph: Path, converted: Any, copies: dict[str, str], float16: Any) -> None:
        onnx = require("onnx", "FP16 conversion")
        self._onnx, self._float16, self._copies = onnx, float16, copies
        self._folder, self._graph_name = graph.parent, graph.name
        self._source = {t.name: t for t in source.graph.initializer}
        external = {n for n, t in self._source.items() if t.data_location == onnx.TensorProto.EXTERNAL}
        self._types = {
            t.name: t.data_type
            for t in converted.initializer
            if is_weight_matrix(t.dims) or copies.get(t.name, t.name) in external
        }

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self._types:
            return default
        onnx = self._onnx
        tensor = onnx.TensorProto()
        tensor.CopyFrom(self._source[self._copies.get(name, name)])
        tensor.name = name
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            from onnx.external_data_helper import load_external_data_for_tensor

            inline = {e.key: e.value for e in tensor.external_data}.get("location") == self._graph_name
            load_external_data_for_tensor(tensor, str(self._folder))
            del tensor.external_data[:]
            if inline:  # in the source graph's own bytes (in_place_model): written as it was there, inline
                tensor.ClearField("data_location")
            else:
                tensor.data_location = onnx.TensorProto.DEFAULT
        if self._types[name] == onnx.TensorProto.FLOAT16 and tensor.data_type == onnx.TensorProto.FLOAT:
            self._float16.convert_tensor_float_to_float16(tensor, _FP16_MIN_POSITIVE, _FP16_MAX)
        return tensor


def _fp16_bytes(source: Any) -> int:
    """About what the FP16 graph's weights take: half the source's float32 initializers (read off their
    shapes: the weights themselves may be external and are not loaded)."""
    return sum(2 * int(np.prod(t.dims, dtype=np.int64)) for t in source.graph.initializer)


def _drop_initializer_value_info(graph: Any) -> None:
    names = {t.name for t in graph.initializer}
    keep = [v for v in graph.value_info if v.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(keep)


def _unshare_initializers(graph: Any, kept: Any) -> dict[str, str]:
    """An initializer read by nodes kept float32 (``kept(node)``) and by others: a copy for the former.
    Returns each copy's name -> the name of the initializer it copies."""
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            if name in inits:
                readers.setdefault(name, []).append(node)
    copies: dict[str, str] = {}
    for name, nodes in readers.items():
        float_nodes = [n for n in nodes if kept(n)]
        if float_nodes and len(float_nodes) < len(nodes):
            copy = graph.initializer.add()
            copy.CopyFrom(inits[name])
            copy.name = next(
                f"{name}.fp32{'' if i == 0 else i}"
                for i in range(len(inits) + 1)
                if f"{name}.fp32{'' if i == 0 else i}" not in inits
            )
            copies[copy.name] = name
            for node in float_nodes:
                node.input[:] = [copy.name if i == name else i for i in node.input]
    return copies


def _cast_to(node: Any) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _drop_fp16_round_trips(graph: Any, types: Any) -> None:
    """Cast(FLOAT) of Cast(FLOAT16)(x) reads x; Casts to FLOAT16 left without a consumer go."""
    producer = {out: n for n in graph.node for out in n.output}
    for node in graph.node:
        source = producer.get(node.input[0]) if _cast_to(node) == types.FLOAT else None
        if source is not None and _cast_to(source) == types.FLOAT16:
            node.input[0] = source.input[0]
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    dead = [n for n in graph.node if _cast_to(n) == types.FLOAT16 and n.output[0] not in used]
    for node in dead:
        graph.node.remove(node)
    gone = {n.output[0] for n in dead}
    keep = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(keep)


def _float_outputs(graph: Any, float_names: set[str], types: Any) -> None:
    """Graph outputs that were FLOAT and came out FLOAT16 from a Cast: that Cast writes FLOAT again."""
    producer = {out: n for n in graph.node for out in n.output}
    for output in graph.output:
        node = producer.get(output.name)
        if (
            output.name in float_names
            and output.type.tensor_type.elem_type == types.FLOAT16
            and _cast_to(node) == types.FLOAT16
        ):
            next(a for a in node.attribute if a.name == "to").i = types.FLOAT
            output.type.tensor_type.elem_type = types.FLOAT
