"""Our own attention fusion for ONNX Runtime: the exporter's attention subgraph to one contrib node.

ONNX Runtime's optimiser fuses none of the exporters' ViT attention, so this pass matches the
Q/K/V MatMuls, the scaled softmax and the head reshapes, and writes one ``MultiHeadAttention``
(or ``Attention``) node per block. Part of ``optimize_for_ort``; the graph it writes is ORT-only.

EVA-02's rotary embedding (model/rope.py) sits between the head split and the scores: a block whose q and k are
rotated is fused too, the one ``MultiHeadAttention`` reading the rotated q, k and v back in [B, N, hidden] layout.

The head reshapes' target shapes are constants in a fixed-size export and computed in the graph
(Shape/Gather/Concat of the batch and token counts) when height and width are dynamic: either way
their length and their trailing ``3, heads, head size`` / ``hidden size`` entries must be proven.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Literal

log = logging.getLogger("vitdeploy.export.optimize")  # part of the ORT optimisation stage

MS_DOMAIN = "com.microsoft"
AttentionOp = Literal["MultiHeadAttention", "Attention", "none"]


class _Graph:
    """Producer/consumer/constant lookups over a GraphProto (rebuilt after each rewrite)."""

    def __init__(self, graph: Any, numpy_helper: Any) -> None:
        self.graph = graph
        self._np = numpy_helper
        self.inits = {i.name: i for i in graph.initializer}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = collections.defaultdict(list)
        for node in graph.node:
            for o in node.output:
                self.producer[o] = node
            for i in node.input:
                self.consumers[i].append(node)
        self.outputs = {o.name for o in graph.output}
        self.declared = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}

    def const(self, name: str) -> Any | None:
        """The value of an initializer or Constant-node output, else None."""
        if name in self.inits:
            return self._np.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    return self._np.to_array(a.t)
        return None

    def vector_length(self, name: str) -> int | None:
        """The element count of a 1-D tensor computed at run time, where the graph proves it: a
        ``Shape`` with explicit start/end, else the exporter's recorded (rank-1, fixed) shape."""
        node = self.producer.get(name)
        if node is not None and node.op_type == "Shape":
            start, end = _attr(node, "start"), _attr(node, "end")
            if start is not None and end is not None and 0 <= start < end:
                rank = self._rank(node.input[0])
                if rank is not None and end <= rank:
                    return end - start
        info = self.declared.get(name)
        if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
            return None
        dims = info.type.tensor_type.shape.dim
        return dims[0].dim_value if len(dims) == 1 and dims[0].HasField("dim_value") else None

    def _rank(self, name: str) -> int | None:
        info = self.declared.get(name)
        if info is None or not info.type.tensor_type.HasField("shape"):
            return None
        return len(info.type.tensor_type.shape.dim)

    def only_consumer(self, name: str, op_type: str) -> Any | None:
        users = self.consumers.get(name, [])
        if len(users) == 1 and users[0].op_type == op_type and name not in self.outputs:
            return users[0]
        return None

    def made_by(self, name: str, op_type: str) -> Any | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _scalar(value: Any) -> float | None:
    if value is None or value.size != 1:
        return None
    return float(value.reshape(-1)[0])


def _strip_scale(g: _Graph, name: str) -> tuple[str, float] | None:
    """Walk up through Mul/Div by a scalar constant; (input before scaling, factor)."""
    factor = 1.0
    for _ in range(2):
        node = g.producer.get(name)
        if node is None or node.op_type not in ("Mul", "Div"):
            break
        a, b = node.input[0], node.input[1]
        cb, ca = _scalar(g.const(b)), _scalar(g.const(a))
        if cb is not None:
            factor = factor * cb if node.op_type == "Mul" else factor / cb
            name = a
        elif ca is not None and node.op_type == "Mul":
            factor *= ca
            name = b
        else:
            return None
    return name, factor


def _gather_of(g: _Graph, name: str) -> tuple[Any, int] | None:
    node = g.made_by(name, "Gather")
    if node is None or _attr(node, "axis", 0) != 0:
        return None
    idx = g.const(node.input[1])
    if idx is None or idx.size != 1 or idx.ndim != 0:
        return None
    return node, int(idx.reshape(-1)[0])


def _shape_entries(g: _Graph, name: str) -> list[int | str] | None:
    """A Reshape's target shape entry by entry: an int where constant, the name of the 1-element tensor
    that holds it where computed at run time (a Concat of parts, the dynamic-size export's form); None
    when its length is not proven."""
    value = g.const(name)
    if value is not None:
        return [int(v) for v in value.reshape(-1)] if value.ndim == 1 else None
    node = g.made_by(name, "Concat")
    if node is None or _attr(node, "axis") not in (0, -1):
        return None
    entries: list[int | str] = []
    for part in node.input:
        value = g.const(part)
        if value is not None and value.ndim == 1:
            entries.extend(int(v) for v in value)
        elif value is None and g.vector_length(part) == 1:
            entries.append(part)
        else:
            return None
    return entries


def _swaps_last_two(perm: list[int]) -> bool:
    n = len(perm)
    return n >= 2 and list(perm) == list(range(n - 2)) + [n - 1, n - 2]


def _rope_source(g: _Graph, name: str) -> tuple[Any, int] | None:
    """A rotated query or key (EVA-02, model/rope.py): a Concat over the tokens (axis 2) of the prefix rows as
    they are and the rotated patch rows, the first a Slice of the head split's Gather -> that Gather, its index.
    The rotation itself is left as it is: the fused node reads its output, [B, heads, N, head size]."""
    node = g.made_by(name, "Concat")
    if node is None or _attr(node, "axis") not in (2, -2) or len(node.input) != 2:
        return None
    first = g.made_by(node.input[0], "Slice")
    return _gather_of(g, first.input[0]) if first is not None else None


def _key_source(g: _Graph, name: str) -> str | None:
    """K^T written as Reshape/Transpose steps with one last-two-axes swap -> the K tensor's name (the head
    split's Gather, or a rotated key)."""
    swaps = 0
    for _ in range(6):
        node = g.producer.get(name)
        if node is None:
            return None
        if node.op_type == "Gather" or (node.op_type == "Concat" and _rope_source(g, name)):
            return name if swaps == 1 else None
        if node.op_type == "Transpose":
            if not _swaps_last_two(_attr(node, "perm", [])):
                return None
            swaps += 1
        elif node.op_type != "Reshape":
            return None
        name = node.input[0]
    return None


def _match_attention(g: _Graph, softmax: Any, num_heads: int, hidden_size: int) -> dict[str, Any] | None:
    """The exporter's attention pattern around one Softmax, or None (see module docstring)."""
    if _attr(softmax, "axis", -1) not in (-1, 3):
        return None
    scores = g.made_by(softmax.input[0], "MatMul")
    ctx = g.only_consumer(softmax.output[0], "MatMul")
    if scores is None or ctx is None or ctx.input[0] != softmax.output[0]:
        return None
    merge_t = g.only_consumer(ctx.output[0], "Transpose")
    if merge_t is None or list(_attr(merge_t, "perm", [])) != [0, 2, 1, 3]:
        return None
    merge_r = g.only_consumer(merge_t.output[0], "Reshape")
    out_shape = _shape_entries(g, merge_r.input[1]) if merge_r is not None else None
    if out_shape is None or len(out_shape) != 3 or out_shape[-1] != hidden_size:
        return None

    q = _strip_scale(g, scores.input[0])
    k = _strip_scale(g, scores.input[1])
    if q is None or k is None:
        return None
    k_name = _key_source(g, k[0])
    q_rope, k_rope = _rope_source(g, q[0]), _rope_source(g, k_name) if k_name else None
    if (q_rope is None) != (k_rope is None):
        return None
    qg, kg = q_rope or _gather_of(g, q[0]), k_rope or (_gather_of(g, k_name) if k_name else None)
    vg = _gather_of(g, ctx.input[1])
    if qg is None or kg is None or vg is None or (qg[1], kg[1], vg[1]) != (0, 1, 2):
        return None
    split_t = g.made_by(qg[0].input[0], "Transpose")
    if split_t is None or kg[0].input[0] != split_t.output[0] or vg[0].input[0] != split_t.output[0]:
        return None
    if list(_attr(split_t, "perm", [])) != [2, 0, 3, 1, 4]:
        return None
    split_r = g.made_by(split_t.input[0], "Reshape")
    shape = _shape_entries(g, split_r.input[1]) if split_r is not None else None
    head = hidden_size // num_heads
    if shape is None or len(shape) != 5 or shape[2:] != [3, num_heads, head]:
        return None
    if shape[:2] != out_shape[:2]:  # the heads merge back into the batch / token layout they were split from
        return None
    bias_add = g.made_by(split_r.input[0], "Add")
    if bias_add is None:
        return None
    for mm_name, b_name in ((bias_add.input[0], bias_add.input[1]), (bias_add.input[1], bias_add.input[0])):
        qkv = g.made_by(mm_name, "MatMul")
        if qkv is not None and b_name in g.inits and qkv.input[1] in g.inits:
            break
    else:
        return None
    w, b = g.const(qkv.input[1]), g.const(b_name)
    if tuple(w.shape) != (hidden_size, 3 * hidden_size) or tuple(b.shape) != (3 * hidden_size,):
        return None
    if len(g.consumers[qkv.output[0]]) != 1 or len(g.consumers[bias_add.output[0]]) != 1:
        return None
    return {
        "x": qkv.input[0],
        "weight": qkv.input[1],
        "bias": b_name,
        "out": merge_r.output[0],
        "replace": merge_r,
        "scale": q[1] * k[1],
        # rotary: the rotated q and k and v, [B, heads, N, head size] (the qkv bias is in them already)
        "rotated": (q[0], k_name, ctx.input[1]) if q_rope is not None else None,
    }


def fuse_attention(proto: Any, *, num_heads: int, hidden_size: int, op: AttentionOp = "MultiHeadAttention") -> int:
    """Rewrite each matched attention block of ``proto`` in place; returns how many were fused."""
    import numpy as np
    from onnx import helper, numpy_helper

    g = _Graph(proto.graph, numpy_helper)
    matches = [
        m
        for m in (_match_attention(g, s, num_heads, hidden_size) for s in proto.graph.node if s.op_type == "Softmax")
        if m
    ]
    if not matches:
        log.warning(
            "attention pattern not found (num_heads=%d, hidden_size=%d); leaving attention unfused",
            num_heads,
            hidden_size,
        )
        return 0
    replacements: dict[int, list[Any]] = {}
    for i, m in enumerate(matches):
        name = f"vitdeploy_attention_{i}"
        if m["rotated"] is not None:
            new = _rotated_attention(proto, m, name, num_heads, hidden_size)
        elif op == "Attention":
            new = [
                helper.make_node(
                    "Attention",
                    [m["x"], m["weight"], m["bias"]],
                    [m["out"]],
                    name=name,
                    domain=MS_DOMAIN,
                    num_heads=num_heads,
                    scale=m["scale"],
                )
            ]
        else:
            # one projection per q / k / v (columns of the packed weight): no Split copy, and the
            # class-token pass can then project the query of one row only
            w = g.const(m["weight"])
            new = []
            for j, part in enumerate("qkv"):
                w_name = f"{name}_{part}_weight"
                proto.graph.initializer.append(
                    numpy_helper.from_array(
                        np.ascontiguousarray(w[:, j * hidden_size : (j + 1) * hidden_size]), w_name
                    )
                )
                new.append(
                    helper.make_node("MatMul", [m["x"], w_name], [f"{name}_{part}"], name=f"{name}_{part}_proj")
                )
            new.append(
                helper.make_node(
                    "MultiHeadAttention",
                    [f"{name}_{p}" for p in "qkv"] + [m["bias"]],
                    [m["out"]],
                    name=name,
                    domain=MS_DOMAIN,
                    num_heads=num_heads,
                    scale=m["scale"],
                )
            )
        replacements[id(m["replace"])] = new
    nodes: list[Any] = []
    for node in proto.graph.node:
        nodes.extend(replacements.get(id(node), [node]))
    _replace_nodes(proto.graph, _live(nodes, {o.name for o in proto.graph.output}))
    _drop_unused_initializers(proto.graph)
    return len(matches)


def _rotated_attention(proto: Any, m: dict[str, Any], name: str, num_heads: int, hidden_size: int) -> list[Any]:
    """One ``MultiHeadAttention`` over rotated q, k and v ([B, heads, N, head size] each, biased already):
    each back to [B, N, hidden] (the layout the op reads), no bias input."""
    import numpy as np
    from onnx import helper, numpy_helper

    shape = f"{name}_tokens_by_hidden"
    proto.graph.initializer.append(numpy_helper.from_array(np.array([0, 0, hidden_size], np.int64), shape))
    new = []
    for part, source in zip("qkv", m["rotated"], strict=True):  # "_rot_": INT8's write-out names "_q_t" ... itself
        t, merged = f"{name}_rot_{part}_t", f"{name}_rot_{part}"
        new += [
            helper.make_node("Transpose", [source], [t], name=t, perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [t, shape], [merged], name=f"{merged}_merge"),
        ]
    attention = helper.make_node(
        "MultiHeadAttention",
        [f"{name}_rot_{p}" for p in "qkv"],
        [m["out"]],
        name=name,
        domain=MS_DOMAIN,
        num_heads=num_heads,
        scale=m["scale"],
    )
    return [*new, attention]


def _live(nodes: list[Any], graph_outputs: set[str]) -> list[Any]:
    """Drop nodes none of whose outputs is used (repeatedly)."""
    while True:
        used = {i for n in nodes for i in n.input} | graph_outputs
        keep = [n for n in nodes if any(o in used for o in n.output)]
        if len(keep) == len(nodes):
            return keep
        nodes = keep


def _replace_nodes(graph: Any, nodes: list[Any]) -> None:
    kept = [type(n)() for n in nodes]
    for dst, src in zip(kept, nodes, strict=True):
        dst.CopyFrom(src)
    del graph.node[:]
    graph.node.extend(kept)


def _drop_unused_initializers(graph: Any) -> None:
    """Delete the initializers no node reads, in place: no copy of the weights that stay (a copy of
    every kept tensor doubled the stage's memory for a moment)."""
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name not in used:
            del graph.initializer[index]
