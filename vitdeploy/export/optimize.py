"""Stage (optional): an ONNX Runtime-only FP32 graph, ``model.ort.onnx``, derived from ``model.onnx``.

``model.onnx`` stays standard ONNX (TensorRT parses the FP16 graph derived from it). This module
writes a *separate* graph for the ONNX Runtime CPU/CUDA backends, with ``com.microsoft`` contrib ops:

* attention (our own pass, matched on the pattern the torch exporter writes for
  ``VisionTransformer``; ONNX Runtime's own attention fusion does not recognise it): packed qkv
  -> per-head reshape/transpose -> scaled QK^T -> Softmax -> V -> transpose/reshape becomes
  three projections (q, k, v columns of the packed weight) + one ``MultiHeadAttention``, or one
  ``Attention`` (which also does the qkv projection, all tokens);
* the last block computed for the class token only (its query projection, attention output, MLP
  and final norm): the classifier reads that one row, so the other rows are dead work (exact;
  ~7% fewer FLOPs on ViT-B/16 at 224);
* bias Add + erf GELU -> ``BiasGelu`` (ONNX Runtime's transformer optimiser, python fusions
  only, ``opt_level=0``, so the file is not tied to this CPU); a tanh GELU (``act: gelu_tanh``)
  -> ``FastGelu``, the same tanh formula (an opset-20 ``Gelu(approximate="tanh")`` is made
  ``FastGelu`` first: ORT's BiasGelu fusion would otherwise make it the erf form). Its ``SkipLayerNormalization`` is
  available but off by default: slower than Add + LayerNormalization on ORT 1.31's CPU kernels.

Every rewrite is exact up to float32 rounding (GELU stays the erf form unless
``gelu_approximation=True`` asks for ``FastGelu``, a tanh approximation that drifts). A graph the
patterns do not match is still written, just less optimised; the counts are logged and returned
by :func:`fused_op_counts`, and the export pipeline validates the file against PyTorch like any
other. benchmarks/README.md has the measurements behind each choice.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable

from ..base._deps import require
from ..base.errors import ExportError
from .fuse_attention import MS_DOMAIN, AttentionOp, _attr, _Graph, _replace_nodes, fuse_attention
from .onnx import quiet_loggers, save_onnx_atomic, set_metadata

log = logging.getLogger(__name__)

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
    class_token_only: bool = True,
    skip_layer_norm: bool = False,
    external_data_threshold_mb: int = 1536,
) -> Path:
    """Write an ONNX Runtime-optimised copy of ``onnx_path`` to ``out_path`` atomically.

    num_heads / hidden_size: the ViT's ``heads`` / ``width`` (the fusions check them against the
        graph; a mismatch leaves attention unfused rather than wrong).
    attention: contrib op for the attention core; "none" skips the attention pass.
    gelu_approximation: replace exact GELU by ``FastGelu`` (tanh form): not exact (ViT-B random-weight
        logits drift ~7e-4 max, ~1e-4 mean: beyond the FP32 validation thresholds); off by default.
    class_token_only: compute the last block only for the class token, the one row the classifier
        reads (exact: the other rows are dead code; ~6% fewer FLOPs on ViT-B/16). Needs the
        MultiHeadAttention form; skipped, with a log line, when the graph does not allow it.
    skip_layer_norm: fuse residual Add + LayerNorm into ``SkipLayerNormalization``. Off: on ONNX
        Runtime 1.31's CPU kernels it is slower than the two ops it replaces (ViT-B, 2 threads:
        ~9 ms vs ~4 ms per inference).
    Returns ``out_path``. Weights above ``external_data_threshold_mb`` go to ``<name>.data``.
    """
    onnx = require("onnx", "ONNX Runtime graph optimisation")
    require("onnxruntime", "ONNX Runtime graph optimisation (onnxruntime.transformers)")
    src, out = Path(onnx_path), Path(out_path)
    if src.resolve() == out.resolve():
        raise ExportError(
            f"optimize_for_ort: output {out} would overwrite its source graph; choose another name "
            "(e.g. model.ort.onnx)"
        )
    if attention not in ("MultiHeadAttention", "Attention", "none"):
        raise ExportError(
            f"optimize_for_ort: attention must be 'MultiHeadAttention', 'Attention' or 'none', got {attention!r}"
        )
    if num_heads <= 0 or hidden_size <= 0 or hidden_size % num_heads:
        raise ExportError(
            f"optimize_for_ort: hidden_size {hidden_size} must be a positive multiple of num_heads {num_heads}"
        )
    try:
        proto = onnx.load(str(src))
    except Exception as exc:  # noqa: BLE001 - onnx raises several types for unreadable files
        raise ExportError(f"optimize_for_ort: cannot read {src}: {exc}; re-run `vitdeploy export`") from exc

    n_attention = 0
    if attention != "none":
        n_attention = fuse_attention(proto, num_heads=num_heads, hidden_size=hidden_size, op=attention)
    if not class_token_only:
        log.info(
            "class-token pruning off: the classifier reads more than the class token (average pooling or "
            "a distillation head)"
        )
    pruned = prune_last_block_to_class_token(proto) if class_token_only and n_attention else False
    tanh_gelu_to_fast_gelu(proto)
    proto = _ort_fusions(
        proto,
        num_heads=num_heads,
        hidden_size=hidden_size,
        gelu_approximation=gelu_approximation,
        skip_layer_norm=skip_layer_norm,
    )
    _ensure_ms_opset(proto, onnx)
    counts = _count(proto.graph.node)
    set_metadata(
        proto,
        {
            METADATA_KEY: json.dumps(
                {
                    "source": src.name,
                    "fused": counts,
                    "attention": attention,
                    "last_block_class_token_only": pruned,
                    "gelu_approximation": gelu_approximation,
                }
            )
        },
    )
    external = _initializer_bytes(proto) > external_data_threshold_mb * 2**20
    save_onnx_atomic(proto, out, external=external, check=False)  # contrib ops: the checker does not know them
    log.info(
        "wrote %s: %d attention blocks fused, last block class-token only: %s, contrib ops %s",
        out,
        n_attention,
        pruned,
        counts,
    )
    return out


def fused_op_counts(path: str | os.PathLike) -> dict[str, int]:
    """How many of each contrib op (see ``FUSED_OPS``) the graph at ``path`` contains."""
    from ..base.onnx_wire import light_model

    require("onnx", "reading an ONNX graph")
    return _count(light_model(Path(path)).graph.node)


def _count(nodes: Iterable[Any]) -> dict[str, int]:
    c = collections.Counter(n.op_type for n in nodes if n.domain == MS_DOMAIN and n.op_type in FUSED_OPS)
    return dict(sorted(c.items()))


# --------------------------------------------------------------------------- class-token pruning

_UNARY = {"Erf", "Tanh", "Sigmoid", "Relu", "Identity", "Cast", "Gelu"}
_BINARY = {"Add", "Sub", "Mul", "Div"}


def prune_last_block_to_class_token(proto: Any) -> bool:
    """After the attention pass: make the last block compute only the class token's row.

    Sound only when everything between the last ``MultiHeadAttention`` and the class-token select
    (``Gather(axis=1, index 0)``) is token-wise (MatMul by a weight, LayerNorm over the last axis,
    elementwise ops with per-feature constants, the residual Add, SwiGLU's Split over the features) and
    nothing else reads it; the query and the residual stream are then sliced to row 0 and the rest follows.
    Returns False, and
    leaves the graph alone, when any of that does not hold.
    """
    from onnx import TensorProto, helper, numpy_helper

    g = _Graph(proto.graph, numpy_helper)
    selects = [
        n
        for n in proto.graph.node
        if n.op_type == "Gather"
        and _attr(n, "axis", 0) == 1
        and (idx := g.const(n.input[1])) is not None
        and idx.ndim == 0
        and int(idx) == 0
    ]
    mhas = [n for n in proto.graph.node if n.op_type == "MultiHeadAttention" and n.domain == MS_DOMAIN]
    if len(selects) != 1 or not mhas:
        log.info(
            "class-token pruning skipped: %d class-token selects, %d MultiHeadAttention nodes", len(selects), len(mhas)
        )
        return False
    select, last = selects[0], mhas[-1]
    region, side = _token_wise_region(g, last.output[0], select)
    if region is None or select.input[0] not in region:
        log.info("class-token pruning skipped: the last block's output reaches more than the class-token select")
        return False
    # the one side input allowed: the residual stream entering the last block (LayerNorm -> q projection)
    q_proj = g.made_by(last.input[0], "MatMul")
    norm = g.made_by(q_proj.input[0], "LayerNormalization") if q_proj is not None else None
    if norm is None or side != {norm.input[0]} or g.consumers[q_proj.output[0]] != [last]:
        log.info("class-token pruning skipped: unexpected inputs %s into the last block", sorted(side))
        return False
    residual = norm.input[0]
    names = {k: f"vitdeploy_cls_{k}" for k in ("starts", "ends", "axes", "normed", "residual")}
    for key, value in (("starts", 0), ("ends", 1), ("axes", 1)):
        proto.graph.initializer.append(helper.make_tensor(names[key], TensorProto.INT64, [1], [value]))
    bounds = [names["starts"], names["ends"], names["axes"]]
    slices = [
        helper.make_node("Slice", [norm.output[0], *bounds], [names["normed"]], name="vitdeploy_cls_query_slice"),
        helper.make_node("Slice", [residual, *bounds], [names["residual"]], name="vitdeploy_cls_residual_slice"),
    ]
    q_proj.input[0] = names["normed"]  # keys and values still see every token
    in_region = {id(g.producer[t]) for t in region if t in g.producer} - {id(last)}
    for node in proto.graph.node:
        if id(node) in in_region:
            for i, name in enumerate(node.input):
                if name == residual:
                    node.input[i] = names["residual"]
    nodes: list[Any] = []
    for node in proto.graph.node:
        if node is q_proj:
            nodes.extend(slices)
        nodes.append(node)
    _replace_nodes(proto.graph, nodes)
    # recorded shapes say 197 rows where there is now one: drop them (shape inference redoes them)
    fresh = [v for v in proto.graph.value_info if v.name not in region]
    if len(fresh) != len(proto.graph.value_info):
        kept = [type(v)() for v in fresh]
        for dst, src in zip(kept, fresh, strict=True):
            dst.CopyFrom(src)
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(kept)
    return True


def _token_wise_region(g: _Graph, start: str, select: Any) -> tuple[set[str] | None, set[str]]:
    """Tensors computed from ``start`` up to ``select`` (forward closure); (None, _) unless every node
    in it works row by row (see ``_is_token_wise``) and none of it is a graph output."""
    region, nodes, todo = {start}, {}, [start]
    while todo:
        for node in g.consumers.get(todo.pop(), []):
            if node is select or id(node) in nodes:
                continue
            nodes[id(node)] = node
            for out in node.output:
                if out and out not in region:
                    region.add(out)
                    todo.append(out)
    side: set[str] = set()
    if region & g.outputs or not all(_is_token_wise(g, n, region, side) for n in nodes.values()):
        return None, side
    return region, side


def _is_token_wise(g: _Graph, node: Any, region: set[str], side: set[str]) -> bool:
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return False
    if op in _UNARY:
        return True
    if op == "LayerNormalization":
        return _attr(node, "axis", -1) == -1 and all(g.const(i) is not None for i in node.input[1:] if i)
    if op == "Split":  # SwiGLU's fc1 output cut into gate and value, along the features (rank 3 here: axis 2)
        return _attr(node, "axis", 0) in (-1, 2) and all(g.const(i) is not None for i in node.input[1:] if i)
    if op == "MatMul":
        w = g.const(node.input[1])
        return node.input[0] in region and w is not None and w.ndim == 2
    if op in _BINARY:
        for name in node.input:
            if name in region:
                continue
            c = g.const(name)
            if c is None:
                if op != "Add":
                    return False
                side.add(name)  # a residual connection: checked by the caller
            elif c.ndim > 1:
                return False
        return True
    return False


# --------------------------------------------------------------------------- GELU forms


def tanh_gelu_to_fast_gelu(proto: Any) -> int:
    """ONNX ``Gelu(approximate="tanh")`` (opset >= 20) -> ``com.microsoft.FastGelu``, the same tanh formula.

    ONNX Runtime's BiasGelu fusion turns ``Add`` + ``Gelu`` into ``BiasGelu``, which is the erf GELU,
    whatever the Gelu's ``approximate`` says (a tanh-GELU ViT drifted ~8e-4). As ``FastGelu`` the node
    is left alone, or fused with its bias into ``FastGelu`` (still the tanh form). At opset < 20 the
    exporter writes the tanh formula out, and ORT's FastGelu fusion recognises it. Returns the count."""
    from onnx import helper

    count = 0
    for i, node in enumerate(proto.graph.node):
        if (
            node.op_type == "Gelu"
            and node.domain in ("", "ai.onnx")
            and _attr(node, "approximate", b"none") in (b"tanh", "tanh")
        ):
            fast = helper.make_node(
                "FastGelu", list(node.input), list(node.output), name=node.name or f"FastGelu_{i}", domain=MS_DOMAIN
            )
            proto.graph.node[i].CopyFrom(fast)
            count += 1
    return count


# --------------------------------------------------------------------------- ORT's own fusions


def _ort_fusions(
    proto: Any, *, num_heads: int, hidden_size: int, gelu_approximation: bool, skip_layer_norm: bool
) -> Any:
    """BiasGelu (/ FastGelu, SkipLayerNormalization) via onnxruntime.transformers, python only."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("vit")
    options.enable_attention = False  # done above; ORT's matcher does not know this pattern anyway
    options.enable_embed_layer_norm = False
    # its shape inference (symbolic, on a copy of the graph with every weight) feeds none of the fusions
    # enabled here: BiasGelu / FastGelu match node patterns (the same graph comes out without it)
    options.enable_shape_inference = False
    options.enable_gelu_approximation = bool(gelu_approximation)
    options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = bool(skip_layer_norm)
    with quiet_loggers("onnxruntime.transformers", "onnx_model", "fusion_base", "optimizer"):
        try:
            model = optimize_model(
                proto,
                model_type="vit",
                num_heads=num_heads,
                hidden_size=hidden_size,
                optimization_options=options,
                opt_level=0,
                use_gpu=False,
            )
        except Exception as exc:  # noqa: BLE001 - a fusion bug must not pass silently
            raise ExportError(
                f"ONNX Runtime transformer optimiser failed: {type(exc).__name__}: {exc}; "
                "export without the ORT-optimised graph (export.ort_optimize: false)"
            ) from exc
    return model.model


def _ensure_ms_opset(proto: Any, onnx: Any) -> None:
    if any(n.domain == MS_DOMAIN for n in proto.graph.node) and not any(
        o.domain == MS_DOMAIN for o in proto.opset_import
    ):
        proto.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))


def _initializer_bytes(proto: Any) -> int:
    return sum(len(t.raw_data) or 4 * len(t.float_data) for t in proto.graph.initializer)
