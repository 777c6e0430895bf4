"""Nodes of a quantized graph returned to float, without quantizing again.

The INT8 autopilot's steps differ from the fully quantized graph only by the nodes they keep in
float. ``quantize_static`` with those nodes excluded writes the graph it wrote fully quantized, less
what those nodes alone asked for: the QuantizeLinear/DequantizeLinear pair of an activation no
quantized node reads any more, the DequantizeLinear of their weights (and of a Gemm's INT32 bias),
those weights' INT8 copies, scales and zero points; the nodes read their float inputs and weights
again, as in the graph it quantized. So a step is derived here from the fully quantized graph and
the pre-processed graph it came from, in a fraction of a quantization's time: the graph's nodes
listed as ONNX Runtime's quantizer lists them before it sorts them (the source's nodes in their
order, then the Q/DQ nodes it added), the initializers as it leaves them (the source's in their
order, then those it added, in its order), sorted and saved by ONNX Runtime's own code. The file is
the same bytes as ``quantize_static`` with those nodes excluded would write (tested).

Where the graph is not one this reasoning covers (an activation first quantized for a node now in
float but still read by a quantized node: the quantizer would then add its pair at another place), or
holds something else than the quantizer's Q/DQ nodes, :func:`dequantize` says so (None) and the
caller quantizes again.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..base._deps import require
from ..base._files import atomic_path
from .onnx_spans import Scanned, Span, scan, write

_Q, _DQ = "QuantizeLinear", "DequantizeLinear"


@dataclass
class _Quantized:
    """What the quantizer added for one tensor of the source: its nodes, the tensor's name there."""

    tensor: str
    nodes: list[Any]


def _quantized_tensors(q: Any, pre: Any, weights: set[str]) -> dict[str, _Quantized] | None:
    """What the quantized graph's nodes read -> the Q/DQ nodes the quantizer added for it (an activation: Q
    and DQ; a weight or a bias: its DQ) and the source tensor (unknown for a weight until :func:`_renames`);
    None when ``q`` holds anything else than the source's nodes and those."""
    ours = {n.name for n in pre.graph.node}
    added = [n for n in q.graph.node if n.name not in ours]
    if len(ours) != len(pre.graph.node) or len(q.graph.node) - len(added) != len(ours):
        return None  # unnamed or renamed nodes: not a graph this module knows
    if any(n.op_type not in (_Q, _DQ) or len(n.output) != 1 for n in added):
        return None
    made = {n.output[0]: n for n in added}
    found: dict[str, _Quantized] = {}
    for dq in (n for n in added if n.op_type == _DQ):
        source = made.get(dq.input[0])
        if source is not None and source.op_type == _Q:  # an activation: source -> Q -> DQ
            found[dq.output[0]] = _Quantized(source.input[0], [source, dq])
        elif dq.output[0] in weights:  # a bias: its INT32 copy -> DQ -> the bias's own name
            found[dq.output[0]] = _Quantized(dq.output[0], [dq])
        elif source is None:  # a weight: its INT8 copy -> DQ -> read in its place
            found[dq.output[0]] = _Quantized("", [dq])
    if sum(len(f.nodes) for f in found.values()) != len(added):
        return None
    return found


def _renames(q: Any, pre: Any, found: dict[str, _Quantized]) -> dict[str, str] | None:
    """Source tensor -> what the quantized graph's nodes read instead (a DQ output); ``found`` re-keyed by the
    source tensor. None when the nodes disagree."""
    by_name = {n.name: n for n in q.graph.node}
    renames: dict[str, str] = {}
    for node in pre.graph.node:
        mine = by_name[node.name]
        if list(mine.output) != list(node.output) or len(mine.input) != len(node.input):
            return None
        for old, new in zip(node.input, mine.input):
            if old != new and renames.setdefault(old, new) != new:
                return None
    for old, new in renames.items():
        entry = found.get(new)
        if entry is None or entry.tensor not in ("", old):
            return None
        del found[new]
        found[old] = _Quantized(old, entry.nodes)
    return renames


def _markers(pre: Any, quantized: set[str]) -> dict[str, str]:
    """Source tensor -> the first node (graph order) of ``quantized`` that reads it: where the quantizer
    marks it, and so where its Q/DQ nodes and their initializers fall in what it writes."""
    first: dict[str, str] = {}
    for node in pre.graph.node:
        if node.name in quantized:
            for name in node.input:
                first.setdefault(name, node.name)
    return first


def _plan(
    q: Any, pre: Any, weights: set[str], keep: set[str], before: set[str], op_types: Sequence[str]
) -> tuple[Any, ...] | None:
    """(the tensors still quantized, the renames their readers take, the nodes newly in float), or None."""
    found = _quantized_tensors(q, pre, weights)
    renames = _renames(q, pre, found) if found is not None else None
    if found is None or renames is None:
        return None
    candidates = [n.name for n in pre.graph.node if n.op_type in op_types]
    was = {n for n in candidates if n not in before}
    now = {n for n in was if n not in keep}
    marked_was, marked_now = _markers(pre, was), _markers(pre, now)
    if set(found) - set(marked_was):
        return None  # quantized for a node this module does not see as quantized
    still = {name for name in found if name in marked_now}
    if any(marked_was[name] != marked_now[name] for name in still):
        return None  # its pair would be added at another place: quantize again
    return still, {k: v for k, v in renames.items() if k in still}, was - now, found


def dequantize(
    full: Path,
    pre: Path,
    dst: Path,
    *,
    keep_float: Sequence[str],
    before: Sequence[str],
    op_types: Sequence[str],
    external_data: bool = False,
) -> bool:
    """Write ``dst``: ``full`` (``quantize_static`` of ``pre`` with the nodes ``before`` excluded) with the
    nodes of ``keep_float`` returned to float, as ``quantize_static`` with ``before`` and ``keep_float``
    excluded writes it (atomically; external data beside it as ``<dst>.data`` with ``external_data``).
    False when the graph is not one this module can derive (nothing written: quantize again).

    Neither graph's weights are parsed but those written (export/onnx_spans.py): an inline graph is
    written one weight at a time, read where it lies in either file."""
    q, source = scan(full), scan(pre)
    plan = _plan(q.model, source.model, {t.name for t in source.spans}, set(keep_float), set(before), op_types)
    if plan is None:
        return False
    still, renames, floated, found = plan
    by_name = {n.name: n for n in q.model.graph.node}
    nodes = []
    for node in source.model.graph.node:  # the source's nodes in their order, reading what is still quantized
        made = type(node)()
        made.CopyFrom(node if node.name in floated else by_name[node.name])
        for i, name in enumerate(node.input):
            made.input[i] = renames.get(name, name)
        nodes.append(made)
    kept = {n.name for name in still for n in found[name].nodes}
    nodes += [n for n in q.model.graph.node if n.name in kept]  # then the quantizer's, in its order
    made_here = {name for n in nodes for name in n.output}  # a quantized bias: its DQ writes the bias's name
    used = ({name for n in nodes for name in n.input} | {o.name for o in q.model.graph.output}) - made_here
    in_q = {t.name: t for t in q.spans}
    ours = {t.name for t in source.spans}
    inits = [(q, in_q[t.name]) if t.name in in_q else (source, t) for t in source.spans if t.name in used]
    inits += [(q, t) for t in q.spans if t.name not in ours and t.name in used]
    model = q.model
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    with tempfile.TemporaryDirectory(prefix=".int8-", dir=dst.parent) as tmp:
        out = Path(tmp) / dst.name
        if external_data:
            _save_external(model, inits, out)
        else:
            _sort(model, [span.name for _, span in inits])
            write(model, [_reader(scanned, span) for scanned, span in inits], out)
        _move(out, dst, external_data)
    return True


def _reader(scanned: Scanned, span: Span) -> tuple[int, Any]:
    """(length, read) of one initializer written inline: its bytes as they lie, or, kept in external data
    there, loaded (as ONNX Runtime's quantizer loads it) and serialized again."""
    tensor = scanned.tensor(span) if span.length < 4096 else None  # a weight kept outside is a short message
    onnx = require("onnx", "INT8 quantization")
    if tensor is None or tensor.data_location != onnx.TensorProto.EXTERNAL:
        return span.length, lambda: scanned.raw(span)
    data = _loaded(tensor, scanned.path.parent, onnx).SerializeToString()
    return len(data), lambda: data


def _sort(model: Any, initializers: list[str]) -> None:
    """``model``'s nodes in the order ONNX Runtime's quantizer saves them (its own topological sort, which
    reads the initializers' names)."""
    onnx = require("onnx", "INT8 quantization")
    from onnxruntime.quantization.onnx_model import ONNXModel

    light = onnx.ModelProto()
    light.graph.node.extend(model.graph.node)
    light.graph.input.extend(model.graph.input)
    light.graph.initializer.extend(onnx.TensorProto(name=name) for name in initializers)
    ONNXModel(light).topological_sort()
    del model.graph.node[:]
    model.graph.node.extend(light.graph.node)


def _save_external(model: Any, inits: list[tuple[Scanned, Span]], out: Path) -> None:
    """With external data: every initializer loaded (from either file's external data where it lies
    there), then sorted and saved by ONNX Runtime's quantizer's own code (its external data file)."""
    onnx = require("onnx", "INT8 quantization")
    from onnxruntime.quantization.onnx_model import ONNXModel

    for scanned, span in inits:
        model.graph.initializer.append(_loaded(scanned.tensor(span), scanned.path.parent, onnx))
    ONNXModel(model).save_model_to_file(str(out), True)


def _loaded(tensor: Any, folder: Path, onnx: Any) -> Any:
    """``tensor`` with its bytes (read from external data where it keeps them there)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        from onnx.external_data_helper import load_external_data_for_tensor

        load_external_data_for_tensor(tensor, str(folder))
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return tensor


def _move(out: Path, dst: Path, external_data: bool) -> None:
    """``out`` (and its data file) into ``dst``: the data file first, the graph last, as export/quantize.py
    moves its own."""
    data = out.with_name(out.name + ".data")
    if external_data and data.is_file():
        os.replace(data, dst.with_name(data.name))
    with atomic_path(dst) as final_tmp:
        os.replace(out, final_tmp)


__all__ = ["dequantize"]
