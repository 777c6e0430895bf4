"""model.int8.onnx's attention: its Q·Kᵀ and weights·V run as INT8 (export/int8_attention.py).

- written out of the fused graph's MultiHeadAttention, the graph answers as the fused one (float rounding);
- quantized, ONNX Runtime runs both products as integer ops, keys and values signed INT8;
- an image's answer is the same alone and inside a batch of 8, and the session setting the int8 backend
  adds changes no answer (speed only);
- the autopilot's handle, ``attention_products``: those nodes left float, attention is float again;
- written out only where it pays: long enough sequences of large enough heads, static INT8 (dynamic
  INT8 leaves the products float, and the fused node is faster then).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

DEPTH, HEADS, WIDTH = 2, 2, 64  # heads of 32


@pytest.fixture(scope="module")
def fused(tmp_path_factory) -> Path:
    """A tiny random ViT's fused graph (model.ort.onnx: MultiHeadAttention, class-token-only last block)."""
    import torch

    from vitdeploy.export.onnx import export_onnx
    from vitdeploy.export.optimize import optimize_for_ort
    from vitdeploy.model import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    model = VisionTransformer(
        ViTConfig(image_size=32, patch_size=8, width=WIDTH, depth=DEPTH, heads=HEADS, num_classes=7)
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # non-zero biases: a rewrite that drops or swaps one would show
    out = tmp_path_factory.mktemp("int8_attention")
    export_onnx(model, out / "model.onnx", image_size=32)
    return optimize_for_ort(out / "model.onnx", out / "model.ort.onnx", num_heads=HEADS, hidden_size=WIDTH)


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def _session(path: Path, config=(), optimized: Path | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    for key, value in config:
        so.add_session_config_entry(key, value)
    if optimized is not None:  # the graph as ONNX Runtime runs it, after its QDQ fusions
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _run(path: Path, x: np.ndarray, config=()) -> np.ndarray:
    return _session(path, config).run(None, {"pixel_values": x})[0]


@pytest.fixture(scope="module")
def quantized(fused, tmp_path_factory) -> Path:
    from vitdeploy.export.quantize import quantize_int8

    dst = tmp_path_factory.mktemp("int8_attention_q") / "model.int8.onnx"
    res = quantize_int8(fused, dst, input_name="pixel_values", calibration=_images(8, seed=1), attention=True)
    assert "attention" in res.summary()  # the manifest says what runs INT8
    return dst


def test_written_out_attention_answers_as_the_fused_graph(fused, tmp_path):
    import onnx

    from vitdeploy.export.int8_attention import attention_products, write_out_attention

    model = onnx.load(str(fused))
    assert write_out_attention(model, fused.parent) == DEPTH
    ops = [n.op_type for n in model.graph.node]
    assert "MultiHeadAttention" not in ops and "Mul" not in ops  # the 1/sqrt(d) scale folded into the query
    assert len(attention_products(model)) == 2 * DEPTH
    onnx.save(model, str(tmp_path / "written-out.onnx"))
    for batch in (1, 3):
        x = _images(batch)
        np.testing.assert_allclose(_run(tmp_path / "written-out.onnx", x), _run(fused, x), atol=2e-5, rtol=0)


def test_the_int8_graph_runs_both_attention_products_as_integer_ops(quantized, tmp_path):
    import onnx

    from vitdeploy.export.int8_attention import CONTEXT, SCORES
    from vitdeploy.runtime.backends.ort import INT8_SESSION_CONFIG

    optimized = tmp_path / "as-run.onnx"
    _session(quantized, INT8_SESSION_CONFIG, optimized)
    nodes = onnx.load(str(optimized)).graph.node
    products = {n.name: n.op_type for n in nodes if n.name.endswith((SCORES, CONTEXT))}
    assert len(products) == 2 * DEPTH
    assert set(products.values()) <= {"MatMulIntegerToFloat", "QLinearMatMul"}, products
    assert not any(n.op_type in ("MatMul", "MultiHeadAttention", "Attention") for n in nodes)
    graph = onnx.load(str(quantized)).graph
    zero_points = {t.name: t.data_type for t in graph.initializer}
    signed = [
        q for q in graph.node if q.op_type == "QuantizeLinear" and zero_points.get(q.input[2]) == onnx.TensorProto.INT8
    ]
    assert len(signed) == 2 * DEPTH  # keys and values: signed INT8 (the fast unsigned x signed kernels)


def test_an_answer_is_the_same_alone_and_in_a_batch_and_the_session_setting_is_speed_only(quantized):
    from vitdeploy.runtime.backends.ort import INT8_SESSION_CONFIG

    x = _images(8, seed=2)
    together = _run(quantized, x, INT8_SESSION_CONFIG)
    alone = np.concatenate([_run(quantized, x[i : i + 1], INT8_SESSION_CONFIG) for i in range(len(x))])
    assert np.array_equal(alone, together)
    assert np.array_equal(_run(quantized, x), together)  # ONNX Runtime's default: unsigned keys, same answers


def test_the_autopilots_handle_leaves_attention_float(fused, tmp_path):
    import onnx

    from vitdeploy.export.int8_attention import attention_products
    from vitdeploy.export.quantize import prepare, quantizable_nodes, quantize_prepared

    pre = prepare(fused, tmp_path / "pre.onnx", optimized=True, attention=True)
    products = attention_products(onnx.load(str(pre), load_external_data=False))
    res = quantize_prepared(
        pre, tmp_path / "q.onnx", input_name="pixel_values", calibration=_images(8, seed=1), keep_float=products
    )
    assert set(products) <= set(res.keep_float) and not set(products) & set(res.quantized_nodes)
    assert "attention" not in res.summary()  # the manifest does not claim it
    assert set(res.quantized_nodes) == set(quantizable_nodes(pre)) - set(products)  # every other MatMul/Gemm INT8
    graph = onnx.load(str(res.path)).graph
    made_by = {o: n.op_type for n in graph.node for o in n.output}
    for node in graph.node:
        if node.name in products:  # float operands: no DequantizeLinear feeds them
            assert node.op_type == "MatMul" and all(made_by.get(i) != "DequantizeLinear" for i in node.input)


def test_attention_is_written_out_where_it_pays_and_in_static_mode_only(fused, tmp_path):
    import onnx

    from vitdeploy.export.int8_attention import MIN_TOKENS, has_fused_attention, pays
    from vitdeploy.export.quantize import prepare

    model = onnx.load(str(fused), load_external_data=False)
    assert not pays(model)  # 17 tokens: the fused float attention stays
    assert has_fused_attention(onnx.load(str(prepare(fused, tmp_path / "short.onnx", optimized=True))))
    for info in model.graph.value_info:  # the same graph said to see 197 tokens
        dims = info.type.tensor_type.shape.dim
        if len(dims) == 3 and dims[1].HasField("dim_value") and dims[1].dim_value == 17:
            dims[1].dim_value = 197
    assert pays(model) and 197 >= MIN_TOKENS
    onnx.save(model, str(tmp_path / "long.onnx"))
    assert not has_fused_attention(
        onnx.load(str(prepare(tmp_path / "long.onnx", tmp_path / "l.onnx", optimized=True)))
    )
    dynamic = prepare(tmp_path / "long.onnx", tmp_path / "dynamic.onnx", optimized=True, mode="dynamic")
    assert has_fused_attention(onnx.load(str(dynamic)))  # dynamic INT8 leaves the products float: fused is faster
