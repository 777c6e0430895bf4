"""Which nodes a written INT8 graph computes in integers, read back from the graph itself.

What an INT8 result reports (its ``quantized_nodes`` and ``keep_float``, the manifest's ``export.int8``
record) is what its graph does, not what the quantizer was asked: ONNX Runtime's quantizers do not keep
every node under its name (``quantize_dynamic`` rewrites a Gemm as ``<gemm>_MatMul`` and an Add before it
quantizes, export/quantize.py), and may leave a node of the quantized op types in float on their own
(dynamic quantization: a MatMul whose second input is not a weight).

A node of the source graph is quantized in the written graph when the node that writes its output there
(the node itself, or what ONNX Runtime put in its place) computes in integers:

- an integer operator (``MatMulInteger``, ``DynamicQuantizeMatMul``, ``QLinearMatMul``, ...): dynamic mode,
  through the ``Mul`` of the scales, the ``Cast`` back to float and a Gemm's bias ``Add`` that ONNX Runtime
  writes after it;
- a MatMul, Gemm or Conv whose two operands are both read through a ``DequantizeLinear`` (static QDQ: ONNX
  Runtime runs it in integers). A node whose weight is float is float, even where its activation is read
  through the Q/DQ pair another node asked for (the quantizer gives every reader of a quantized activation
  its DequantizeLinear).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..base.errors import ExportError

#: operators that compute a product in integers (ONNX Runtime's IntegerOps and QOperator formats)
INTEGER_OPS = frozenset(
    {
        "MatMulInteger",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "ConvInteger",
        "QGemm",
        "QLinearMatMul",
        "QLinearConv",
        "QAttention",
    }
)
_WEIGHTED = ("MatMul", "Gemm", "Conv")
#: what ONNX Runtime writes between an integer product and the float tensor the node it replaced wrote
_AFTER = ("Mul", "Cast", "Add")
_DEPTH = 4  # the longest such chain: Add <- Mul <- Cast <- MatMulInteger


def _integer(tensor: str, producers: dict[str, Any], depth: int = _DEPTH) -> bool | None:
    """Whether ``tensor`` is computed in integers (None: nothing in the graph writes it)."""
    node = producers.get(tensor)
    if node is None:
        return None
    if node.op_type in INTEGER_OPS:
        return True
    if node.op_type in _WEIGHTED:
        operands = [producers.get(name) for name in node.input[:2]]
        return all(p is not None and p.op_type == "DequantizeLinear" for p in operands)
    if node.op_type in _AFTER and depth:
        return any(_integer(name, producers, depth - 1) for name in node.input if name in producers)
    return False


def quantized_in_graph(written: Any, source: Any, op_types: Sequence[str]) -> tuple[str, ...]:
    """The nodes of ``source`` (a ModelProto; those of ``op_types``, in its order) that the graph ``written``
    (a ModelProto quantized from it) computes in integers. ExportError when ``written`` does not write one of
    their outputs (not a graph quantized from ``source``)."""
    producers = {name: node for node in written.graph.node for name in node.output}
    found = []
    for node in (n for n in source.graph.node if n.op_type in op_types):
        integer = _integer(node.output[0], producers)
        if integer is None:
            raise ExportError(f"INT8 read-back: nothing in the quantized graph writes {node.name}'s output")
        if integer:
            found.append(node.name)
    return tuple(found)


def read_quantized_nodes(
    written: Path, source: Path, op_types: Sequence[str], keep_float: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the nodes of ``op_types`` the graph at ``written`` quantizes, those it leaves in float: ``keep_float``
    and any the quantizer left in float on its own), read from the graphs without their weights
    (export/onnx_spans.py). ExportError naming them when it quantized a node of ``keep_float``."""
    from .onnx_spans import scan

    model, pre = scan(written).model, scan(source).model
    quantized = quantized_in_graph(model, pre, op_types)
    wrong = [name for name in quantized if name in set(keep_float)]
    if wrong:
        import onnxruntime

        raise ExportError(
            f"INT8 quantization of {source.name}: ONNX Runtime {onnxruntime.__version__} quantized "
            f"{len(wrong)} node(s) it was told to keep in float ({', '.join(wrong[:3])}): its graph is not "
            "what export.int8 asked for (export.int8.mode: static quantizes every node under its own name)"
        )
    floated = [n.name for n in pre.graph.node if n.op_type in op_types and n.name not in set(quantized)]
    return quantized, tuple(dict.fromkeys([*keep_float, *floated]))


__all__ = ["INTEGER_OPS", "quantized_in_graph", "read_quantized_nodes"]
