"""Attention's two matrix products where INT8 quantization reaches them (model.int8.onnx).

The fused FP32 graph (export/fuse_attention.py) computes attention in one ``MultiHeadAttention`` node,
float inside: its Q·Kᵀ and weights·V products are invisible to the quantizer. For the INT8 graph each
such node is written out again, per block (names prefixed with the node's own name):

    q, k, v (the projections' outputs, [B, N, D]) + their bias columns    Add
    -> [B, N, H, d] -> q [B, H, N, d], k [B, H, d, N], v [B, H, N, d]     Reshape, Transpose
    -> ``<name>_scores`` = q · k                                          MatMul (Q·Kᵀ)
    -> Softmax (float) -> ``<name>_context`` = weights · v                MatMul
    -> [B, N, H, d] -> [B, N, D]                                          Transpose, Reshape

which ``quantize_static`` then quantizes like every other MatMul: ONNX Runtime runs Q·Kᵀ as
``MatMulIntegerToFloat`` and weights·V as ``QLinearMatMul`` (its output is the next projection's
quantized input), and moves the quantization before the reshapes and transposes, which then move
bytes, not floats. The attention scale (1/sqrt(d)) is folded into the query projection's weight and
bias, as ``MultiHeadAttention`` applies it, so no float multiply is left on the scores.

Keys and values (the products' second operands) are quantized as signed, symmetric INT8 (see
:func:`signed_operands`): ONNX Runtime's x86 INT8 kernels are fast for unsigned x signed operands only;
on unsigned x unsigned the two products ran no faster than the float attention they replace (ViT-B/16,
one thread). The rewrite alone is exact up to float rounding (tested against the fused graph).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from .fuse_attention import MS_DOMAIN, _attr

log = logging.getLogger(__name__)

#: the suffixes of the two products' node names (after the MultiHeadAttention node's name)
SCORES, CONTEXT = "_scores", "_context"
#: Where writing attention out pays (one thread, CPU time, batch 1 / 8, INT8 graph against the same graph
#: with attention float in the fused node): 197 tokens, head size 64 (ViT-B/16, ViT-Ti/16): 5-7% and
#: 8-12% faster; 50 and 65 tokens, head size 64 (ViT-B/32; a ViT-S at 128 px): within +-2%; head size 16
#: (the demo model, 65 tokens: 20% slower at batch 8; 257 tokens: +6% / -4%). Below these, the fused
#: float attention stays, and so does its accuracy.
MIN_TOKENS, MIN_HEAD_SIZE = 128, 32


def has_fused_attention(model: Any) -> bool:
    return any(n.op_type == "MultiHeadAttention" and n.domain == MS_DOMAIN for n in model.graph.node)


def pays(model: Any) -> bool:
    """Whether writing out ``model``'s fused attention is worth it (:data:`MIN_TOKENS`, :data:`MIN_HEAD_SIZE`),
    read off its first ``MultiHeadAttention``: the head size from its packed bias and head count, the token
    count from its output's recorded shape (unknown, as in an export for several image sizes: counted as
    long enough)."""
    inits = {t.name: t for t in model.graph.initializer}
    shapes = {v.name: v.type.tensor_type.shape.dim for v in (*model.graph.value_info, *model.graph.output)}
    for node in model.graph.node:
        if node.op_type != "MultiHeadAttention" or node.domain != MS_DOMAIN:
            continue
        bias = inits.get(node.input[3]) if len(node.input) > 3 else None
        heads = int(_attr(node, "num_heads"))
        if bias is not None and bias.dims[0] // 3 // heads < MIN_HEAD_SIZE:
            return False
        dims = shapes.get(node.output[0])
        tokens = dims[1].dim_value if dims is not None and len(dims) == 3 and dims[1].HasField("dim_value") else None
        return tokens is None or tokens >= MIN_TOKENS
    return False


def write_out_attention(model: Any, base_dir: Path) -> int:
    """Rewrite every ``MultiHeadAttention`` of ``model`` (a ModelProto, its weights in memory or in external
    data under ``base_dir``) as MatMul / Softmax / MatMul, in place; returns how many were written out."""
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    nodes: list[Any] = []
    count = 0
    for node in model.graph.node:
        if node.op_type != "MultiHeadAttention" or node.domain != MS_DOMAIN:
            nodes.append(node)
            continue
        nodes.extend(_written_out(model, node, inits, producer, base_dir, helper))
        count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        _drop_unused(model.graph)
        log.info("attention written out for INT8 in %d block(s)", count)
    return count


def _written_out(model: Any, mha: Any, inits: dict, producer: dict, base_dir: Path, helper: Any) -> list[Any]:
    """The nodes replacing one ``MultiHeadAttention`` (q, k, v inputs, optional packed bias)."""
    from onnx import numpy_helper

    q, k, v = mha.input[:3]
    bias = mha.input[3] if len(mha.input) > 3 and mha.input[3] else None
    packed = _array(inits[bias], base_dir) if bias else None
    width = packed.shape[0] // 3 if packed is not None else _width(inits, producer.get(q))
    heads = int(_attr(mha, "num_heads"))
    scale = float(_attr(mha, "scale", 0.0) or 0.0) or 1.0 / float(np.sqrt(width // heads))
    p = mha.name or f"attention_{id(mha)}"
    add = model.graph.initializer.append
    folded = _fold_scale(model, producer.get(q), inits, base_dir, p, scale)
    nodes: list[Any] = []
    for j, (name, part) in enumerate((("q", q), ("k", k), ("v", v))):
        if packed is not None:
            column = packed[j * width : (j + 1) * width].astype(np.float32)
            column = column * np.float32(scale) if name == "q" and folded else column
            add(numpy_helper.from_array(np.ascontiguousarray(column), f"{p}_{name}_bias"))
            nodes.append(
                helper.make_node("Add", [part, f"{p}_{name}_bias"], [f"{p}_{name}_b"], name=f"{p}_{name}_add")
            )
            part = f"{p}_{name}_b"
        nodes.append(helper.make_node("Reshape", [part, f"{p}_heads"], [f"{p}_{name}_h"], name=f"{p}_{name}_heads"))
        perm = [0, 2, 3, 1] if name == "k" else [0, 2, 1, 3]
        nodes.append(
            helper.make_node("Transpose", [f"{p}_{name}_h"], [f"{p}_{name}_t"], name=f"{p}_{name}_t", perm=perm)
        )
    add(numpy_helper.from_array(np.array([0, 0, heads, width // heads], np.int64), f"{p}_heads"))
    add(numpy_helper.from_array(np.array([0, 0, width], np.int64), f"{p}_merged"))
    scores = f"{p}{SCORES}"
    nodes.append(helper.make_node("MatMul", [f"{p}_q_t", f"{p}_k_t"], [scores], name=scores))
    if not folded:  # the query's projection could not carry the scale: the scores are scaled
        add(numpy_helper.from_array(np.array(scale, np.float32), f"{p}_scale"))
        nodes.append(helper.make_node("Mul", [scores, f"{p}_scale"], [f"{p}_scaled"], name=f"{p}_scale_mul"))
        scores = f"{p}_scaled"
    return nodes + [
        helper.make_node("Softmax", [scores], [f"{p}_weights"], name=f"{p}_softmax", axis=-1),
        helper.make_node("MatMul", [f"{p}_weights", f"{p}_v_t"], [f"{p}{CONTEXT}"], name=f"{p}{CONTEXT}"),
        helper.make_node("Transpose", [f"{p}{CONTEXT}"], [f"{p}_merge_t"], name=f"{p}_merge_t", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [f"{p}_merge_t", f"{p}_merged"], [mha.output[0]], name=f"{p}_merge"),
    ]


def _fold_scale(model: Any, proj: Any, inits: dict, base_dir: Path, p: str, scale: float) -> bool:
    """Fold the attention scale into the query projection (a MatMul by a weight matrix nothing else reads):
    a new, scaled weight in memory. False when it cannot be folded (the scores are then scaled)."""
    from onnx import numpy_helper

    if proj is None or proj.op_type != "MatMul" or proj.input[1] not in inits:
        return False
    if sum(proj.input[1] in n.input for n in model.graph.node) != 1:
        return False
    weight = _array(inits[proj.input[1]], base_dir)
    name = f"{p}_q_weight_scaled"
    model.graph.initializer.append(numpy_helper.from_array((weight * np.float32(scale)).astype(np.float32), name))
    proj.input[1] = name
    return True


def _array(tensor: Any, base_dir: Path) -> np.ndarray:
    """An initializer's values, read from its external data file where it has one (a copy: the graph's
    tensor is left as it is)."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if uses_external_data(tensor):
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        load_external_data_for_tensor(copy, str(base_dir))
        copy.data_location = onnx.TensorProto.DEFAULT
        del copy.external_data[:]
        tensor = copy
    return numpy_helper.to_array(tensor)


def _width(inits: dict, proj: Any) -> int:
    """The hidden size, from the query projection's weight (when the attention has no bias to read it from), or
    from the [0, 0, hidden] a rotated query is merged to (EVA-02: fuse_attention's rotated attention)."""
    if proj is not None and proj.op_type == "MatMul" and proj.input[1] in inits:
        return int(inits[proj.input[1]].dims[-1])
    if proj is not None and proj.op_type == "Reshape" and proj.input[1] in inits:
        from onnx import numpy_helper

        shape = numpy_helper.to_array(inits[proj.input[1]])
        if shape.ndim == 1 and shape.size == 3 and shape[-1] > 0:
            return int(shape[-1])
    raise ValueError("attention without a bias or a query projection by a weight: its hidden size is unknown")


def _drop_unused(graph: Any) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name not in used:
            del graph.initializer[index]


def attention_products(model: Any) -> tuple[str, ...]:
    """The names of the attention products of a written-out graph (Q·Kᵀ and weights·V of each block, in
    graph order): the MatMuls the autopilot returns to float to give attention back to float."""
    return tuple(
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and n.name.endswith((SCORES, CONTEXT)) and _is_attention(n, model)
    )


def _is_attention(node: Any, model: Any) -> bool:
    weights = {t.name for t in model.graph.initializer}
    return not any(i in weights for i in node.input)


def signed_operands(model: Any, quantized: set[str]) -> list[str]:
    """The second operands (keys, values) of the attention products among ``quantized`` node names: the
    tensors quantized as signed symmetric INT8 (``quantize_static``'s TensorQuantOverrides)."""
    names = set(attention_products(model)) & set(quantized)
    return [n.input[1] for n in model.graph.node if n.name in names]


def written_out_copy(src: Path, dst: Path, external_data: bool) -> Path:
    """``src`` with its attention written out, saved as ``dst`` (weights in ``<dst>.data`` when
    ``external_data``): for ONNX Runtime's own pre-processing, which reads a file."""
    import onnx

    model = onnx.load(str(src))
    write_out_attention(model, src.parent)
    if external_data:
        onnx.save_model(model, str(dst), save_as_external_data=True, location=f"{dst.name}.data")
    else:
        onnx.save_model(model, str(dst))
    return dst
