"""Stage (optional): an ONNX Runtime-only FP32 graph, ``model.ort.onnx``, derived from ``model.onnx``.

``model.onnx`` stays standard ONNX (TensorRT parses the FP16 graph derived from it). This module
writes a *separate* graph for the ONNX Runtime CPU/CUDA backends in which each transformer block is
a handful of ``com.microsoft`` contrib kernels instead of ~40 small standard ops:

* attention (our own pass, matched on the pattern the torch exporter writes for
  ``VisionTransformer``): qkv split -> per-head reshape/transpose -> scaled QK^T -> Softmax -> V
  -> transpose/reshape becomes one ``MultiHeadAttention`` (fed by the unchanged qkv MatMul and a
  Split) or one ``Attention`` (which also does the qkv projection);
* residual Add + LayerNormalization -> ``SkipLayerNormalization``, bias Add + erf GELU ->
  ``BiasGelu`` (ONNX Runtime's transformer optimiser, python fusions only, ``opt_level=0``, so
  the file is not tied to this CPU).

Every fusion is exact up to float32 rounding (GELU stays the erf form unless
``gelu_approximation=True`` asks for ``FastGelu``, a tanh approximation that drifts). A graph the
patterns do not match is still written, just less fused; the counts are logged and returned by
:func:`fused_op_counts`, and the export pipeline validates the file against PyTorch like any other.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Literal

from .._deps import require
from ..errors import ExportError

log = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"
AttentionOp = Literal["MultiHeadAttention", "Attention", "none"]
# Contrib ops this module may produce; fused_op_counts() reports them.
FUSED_OPS = ("MultiHeadAttention", "Attention", "SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu")
METADATA_KEY = "vitdeploy.ort_optimized"


def optimize_for_ort(
    onnx_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    num_heads: int,
    hidden_size: int,
    attention: AttentionOp = "MultiHeadAttention",
    gelu_approximation: bool = False,
    external_data_threshold_mb: int = 1536,
) -> Path:
    """Write an ONNX Runtime-optimised copy of ``onnx_path`` to ``out_path`` atomically.

    num_heads / hidden_size: the ViT's ``heads`` / ``width`` (the fusions check them against the
        graph; a mismatch leaves attention unfused rather than wrong).
    attention: contrib op for the attention core; "none" skips the attention pass.
    gelu_approximation: replace exact GELU by ``FastGelu`` (tanh form): faster on some CPUs but
        not exact (logit drift ~1e-3 on ViT-B); off by default.
    Returns ``out_path``. Weights above ``external_data_threshold_mb`` go to ``<name>.data``.
    """
    onnx = require("onnx", "ONNX Runtime graph optimisation")
    require("onnxruntime", "ONNX Runtime graph optimisation (onnxruntime.transformers)")
    src, out = Path(onnx_path), Path(out_path)
    if src.resolve() == out.resolve():
        raise ExportError(f"optimize_for_ort: output {out} would overwrite its source graph; choose another name "
                          "(e.g. model.ort.onnx)")
    if attention not in ("MultiHeadAttention", "Attention", "none"):
        raise ExportError(f"optimize_for_ort: attention must be 'MultiHeadAttention', 'Attention' or 'none', "
                          f"got {attention!r}")
    if num_heads <= 0 or hidden_size <= 0 or hidden_size % num_heads:
        raise ExportError(f"optimize_for_ort: hidden_size {hidden_size} must be a positive multiple of "
                          f"num_heads {num_heads}")
    try:
        proto = onnx.load(str(src))
    except Exception as exc:  # noqa: BLE001 - onnx raises several types for unreadable files
        raise ExportError(f"optimize_for_ort: cannot read {src}: {exc}; re-run `vitdeploy export`") from exc

    n_attention = 0
    if attention != "none":
        n_attention = fuse_attention(proto, num_heads=num_heads, hidden_size=hidden_size, op=attention)
    proto = _ort_fusions(proto, num_heads=num_heads, hidden_size=hidden_size, gelu_approximation=gelu_approximation)
    _ensure_ms_opset(proto, onnx)
    counts = _count(proto.graph.node)
    _set_metadata(proto, {METADATA_KEY: json.dumps({"source": src.name, "fused": counts,
                                                    "gelu_approximation": gelu_approximation})})
    external = _initializer_bytes(proto) > external_data_threshold_mb * 2**20
    _save_atomic(proto, out, external, onnx)
    log.info("wrote %s: %d attention blocks fused, contrib ops %s", out, n_attention, counts)
    return out


def fused_op_counts(path: str | os.PathLike) -> dict[str, int]:
    """How many of each contrib op (see ``FUSED_OPS``) the graph at ``path`` contains."""
    onnx = require("onnx", "reading an ONNX graph")
    return _count(onnx.load(str(path), load_external_data=False).graph.node)


def _count(nodes: Iterable[Any]) -> dict[str, int]:
    c = collections.Counter(n.op_type for n in nodes if n.domain == MS_DOMAIN and n.op_type in FUSED_OPS)
    return dict(sorted(c.items()))


# --------------------------------------------------------------------------- attention pass

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


def _swaps_last_two(perm: list[int]) -> bool:
    n = len(perm)
    return n >= 2 and list(perm) == list(range(n - 2)) + [n - 1, n - 2]


def _key_source(g: _Graph, name: str) -> str | None:
    """K^T written as Reshape/Transpose steps with one last-two-axes swap -> the K tensor's name."""
    swaps = 0
    for _ in range(6):
        node = g.producer.get(name)
        if node is None:
            return None
        if node.op_type == "Gather":
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
    out_shape = g.const(merge_r.input[1]) if merge_r is not None else None
    if out_shape is None or out_shape.size != 3 or int(out_shape[-1]) != hidden_size:
        return None

    q = _strip_scale(g, scores.input[0])
    k = _strip_scale(g, scores.input[1])
    if q is None or k is None:
        return None
    k_name = _key_source(g, k[0])
    qg, kg = _gather_of(g, q[0]), _gather_of(g, k_name) if k_name else None
    vg = _gather_of(g, ctx.input[1])
    if qg is None or kg is None or vg is None or (qg[1], kg[1], vg[1]) != (0, 1, 2):
        return None
    split_t = g.made_by(qg[0].input[0], "Transpose")
    if split_t is None or kg[0].input[0] != split_t.output[0] or vg[0].input[0] != split_t.output[0]:
        return None
    if list(_attr(split_t, "perm", [])) != [2, 0, 3, 1, 4]:
        return None
    split_r = g.made_by(split_t.input[0], "Reshape")
    shape = g.const(split_r.input[1]) if split_r is not None else None
    head = hidden_size // num_heads
    if shape is None or shape.size != 5 or [int(s) for s in shape[2:]] != [3, num_heads, head]:
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
    return {"x": qkv.input[0], "weight": qkv.input[1], "bias": b_name, "qkv_out": qkv.output[0],
            "out": merge_r.output[0], "replace": merge_r, "scale": q[1] * k[1]}


def fuse_attention(proto: Any, *, num_heads: int, hidden_size: int, op: AttentionOp = "MultiHeadAttention") -> int:
    """Rewrite each matched attention block of ``proto`` in place; returns how many were fused."""
    from onnx import TensorProto, helper, numpy_helper

    g = _Graph(proto.graph, numpy_helper)
    matches = [m for m in (_match_attention(g, s, num_heads, hidden_size)
                           for s in proto.graph.node if s.op_type == "Softmax") if m]
    if not matches:
        log.warning("attention pattern not found (num_heads=%d, hidden_size=%d); leaving attention unfused",
                    num_heads, hidden_size)
        return 0
    split_sizes = f"vitdeploy_qkv_split_{hidden_size}"
    if op == "MultiHeadAttention" and split_sizes not in g.inits:
        proto.graph.initializer.append(helper.make_tensor(split_sizes, TensorProto.INT64, [3], [hidden_size] * 3))
    replacements: dict[int, list[Any]] = {}
    for i, m in enumerate(matches):
        name = f"vitdeploy_attention_{i}"
        if op == "Attention":
            new = [helper.make_node("Attention", [m["x"], m["weight"], m["bias"]], [m["out"]], name=name,
                                    domain=MS_DOMAIN, num_heads=num_heads, scale=m["scale"])]
        else:
            qkv = [f"{name}_{p}" for p in "qkv"]
            new = [helper.make_node("Split", [m["qkv_out"], split_sizes], qkv, name=f"{name}_split", axis=-1),
                   helper.make_node("MultiHeadAttention", [*qkv, m["bias"]], [m["out"]], name=name,
                                    domain=MS_DOMAIN, num_heads=num_heads, scale=m["scale"])]
        replacements[id(m["replace"])] = new
    nodes: list[Any] = []
    for node in proto.graph.node:
        nodes.extend(replacements.get(id(node), [node]))
    _replace_nodes(proto.graph, _live(nodes, {o.name for o in proto.graph.output}))
    _drop_unused_initializers(proto.graph)
    return len(matches)


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
    for dst, src in zip(kept, nodes):
        dst.CopyFrom(src)
    del graph.node[:]
    graph.node.extend(kept)


def _drop_unused_initializers(graph: Any) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [i for i in graph.initializer if i.name in used]
    if len(keep) != len(graph.initializer):
        kept = [type(i)() for i in keep]
        for dst, src in zip(kept, keep):
            dst.CopyFrom(src)
        del graph.initializer[:]
        graph.initializer.extend(kept)


# --------------------------------------------------------------------------- ORT's own fusions

def _ort_fusions(proto: Any, *, num_heads: int, hidden_size: int, gelu_approximation: bool) -> Any:
    """SkipLayerNormalization / BiasGelu (/ FastGelu) via onnxruntime.transformers, python only."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("vit")
    options.enable_attention = False  # done above; ORT's matcher does not know this pattern anyway
    options.enable_embed_layer_norm = False
    options.enable_gelu_approximation = bool(gelu_approximation)
    with _quiet("onnxruntime.transformers", "onnx_model", "fusion_base", "optimizer"):
        try:
            model = optimize_model(proto, model_type="vit", num_heads=num_heads, hidden_size=hidden_size,
                                   optimization_options=options, opt_level=0, use_gpu=False)
        except Exception as exc:  # noqa: BLE001 - a fusion bug must not pass silently
            raise ExportError(f"ONNX Runtime transformer optimiser failed: {type(exc).__name__}: {exc}; "
                              "export without the ORT-optimised graph (export.ort_optimize: false)") from exc
    return model.model


@contextlib.contextmanager
def _quiet(*names: str):
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _ensure_ms_opset(proto: Any, onnx: Any) -> None:
    if any(n.domain == MS_DOMAIN for n in proto.graph.node) and not any(o.domain == MS_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))


def _set_metadata(proto: Any, metadata: dict[str, str]) -> None:
    existing = {p.key: p for p in proto.metadata_props}
    for key, text in metadata.items():
        if key in existing:
            existing[key].value = text
        else:
            prop = proto.metadata_props.add()
            prop.key, prop.value = key, text


def _initializer_bytes(proto: Any) -> int:
    return sum(len(t.raw_data) or 4 * len(t.float_data) for t in proto.graph.initializer)


def _save_atomic(proto: Any, out: Path, external: bool, onnx: Any) -> None:
    """Stage in a temp folder beside ``out``; move the data file first, the graph (which names it) last."""
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    data_name = f"{out.name}.data"
    try:
        staged = workdir / out.name
        try:
            if external:
                onnx.save_model(proto, str(staged), save_as_external_data=True, all_tensors_to_one_file=True,
                                location=data_name, size_threshold=1024)
            else:
                onnx.save_model(proto, str(staged))
        except (OSError, ValueError) as exc:
            raise ExportError(f"cannot write {out}: {exc}") from exc
        if external:
            os.replace(workdir / data_name, out.parent / data_name)
        else:
            (out.parent / data_name).unlink(missing_ok=True)  # stale, from an earlier larger model
        os.replace(staged, out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
