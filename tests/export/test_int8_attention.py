"""model.int8.onnx's attention: its Q·Kᵀ and weights·V run as INT8 (export/int8_attention.py).

- written out of the fused graph's MultiHeadAttention, the graph answers as the fused one (float rounding);
- quantized, ONNX Runtime runs both products as integer ops, keys and values signed INT8;
- an image's answer is the same alone and inside a batch of 8, and the session setting the int8 backend
  adds changes no answer (speed only);
- the autopilot's handle, ``attention_products``: those nodes left float, attention is float again;
- the speed budget counts the two products' multiply-adds; when INT8 attention misses the gate, the
  autopilot's first step returns it to float (and with attention fused, there is no such step);
- written out only where it pays: long enough sequences of large enough heads, static INT8 (dynamic
  INT8 leaves the products float, and the fused node is faster then).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_export import FUSED, fused_tiny_vit

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

DEPTH, HEADS, WIDTH = FUSED["depth"], FUSED["heads"], FUSED["width"]  # heads of 32


@pytest.fixture(scope="module")
def fused(tmp_path_factory) -> Path:
    return fused_tiny_vit(tmp_path_factory.mktemp("int8_attention"))


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


def test_the_speed_budget_counts_the_attention_products_from_their_shapes(fused, tmp_path):
    import onnx

    from vitdeploy.export.int8_attention import attention_products
    from vitdeploy.export.int8_speed import multiply_adds
    from vitdeploy.export.quantize import prepare

    model = onnx.load(str(prepare(fused, tmp_path / "pre.onnx", optimized=True, attention=True)))
    costs = multiply_adds(model, ("MatMul", "Gemm"))
    tokens = 17  # 16 patches and the class token; the last block's query is the class token alone
    full, class_token = tokens * tokens * WIDTH, 1 * tokens * WIDTH  # heads x rows x head width x tokens
    assert [costs[n] for n in attention_products(model)] == [full, full, class_token, class_token]


#: every key shifted by this (the key part of each qkv bias): a query's scores all move by the same amount,
#: so softmax and the float graph do not change, but per-tensor INT8 keys spread their 256 steps over it
KEY_SHIFT = 200.0


@pytest.fixture(scope="module")
def shifted_keys(tmp_path_factory) -> Path:
    return fused_tiny_vit(tmp_path_factory.mktemp("int8_attention_shifted"), key_shift=KEY_SHIFT)


def test_the_autopilot_returns_attention_to_float_first_when_its_int8_misses_the_gate(shifted_keys, tmp_path):
    """A gate (validation.int8's max |logit diff|) that the fully quantized graph misses because of its INT8
    keys, and that the same graph with attention in float meets: the autopilot's first step after the fully
    quantized graph is "attention float", and it ships, as the file quantize_static writes with the
    attention products excluded; the manifest's table and summary say so."""
    import onnx

    from vitdeploy.export.compare import compare
    from vitdeploy.export.int8_attention import attention_products
    from vitdeploy.export.int8_autopilot import ATTENTION_FLOAT, run_autopilot
    from vitdeploy.export.quantize import prepare, quantize_prepared

    pre = prepare(shifted_keys, tmp_path / "pre.onnx", optimized=True, attention=True)
    products = attention_products(onnx.load(str(pre), load_external_data=False))
    x, args = _images(16, seed=3), dict(input_name="pixel_values", calibration=_images(8, seed=1))
    args["ranges"] = tmp_path / "ranges.json"
    reference = _run(shifted_keys, x)
    for folder in ("int8", "attention-float", "shipped"):
        (tmp_path / folder).mkdir()
    int8 = quantize_prepared(pre, tmp_path / "int8" / "model.int8.onnx", **args)
    direct = quantize_prepared(pre, tmp_path / "attention-float" / "model.int8.onnx", keep_float=products, **args)
    missed = float(np.abs(_run(int8.path, x) - reference).max())
    met = float(np.abs(_run(direct.path, x) - reference).max())
    assert met < missed  # the INT8 keys are what costs accuracy here
    gate = {"max_abs_diff": (met + missed) / 2}

    res = run_autopilot(
        pre,
        tmp_path / "shipped" / "model.int8.onnx",
        judge=lambda path: compare(reference, _run(path, x), gate),
        quick=lambda path: None,  # a first look at the largest step that proves nothing
        depth=DEPTH,
        **args,
    )
    table = [step.to_dict() for step in res.steps]  # manifest.json's export.int8.autopilot
    assert [(s["step"], s["passed"]) for s in table] == [("all MatMul/Gemm quantized", False), (ATTENTION_FLOAT, True)]
    assert table[1]["keep_float"] == list(products) and "max_abs_diff" in table[0]["failures"][0]
    shipped = res.result
    assert shipped.path.read_bytes() == direct.path.read_bytes()
    summary = shipped.summary()  # manifest.json's export.int8
    assert "attention" in int8.summary() and "attention" not in summary
    assert set(products) <= set(summary["keep_float"])
    assert summary["quantized_nodes"] == len(int8.quantized_nodes) - len(products)


def test_no_attention_step_where_attention_stays_fused(shifted_keys, tmp_path):
    """Attention left fused (float inside its node): after the fully quantized graph the ladder goes to the
    head, then the blocks. (A gate only a graph without INT8 meets: the largest step, every MatMul/Gemm
    float, passes; every step before it is judged and misses.)"""
    from vitdeploy.export.compare import compare
    from vitdeploy.export.int8_autopilot import ATTENTION_FLOAT, run_autopilot
    from vitdeploy.export.quantize import prepare

    pre = prepare(shifted_keys, tmp_path / "pre.onnx", optimized=True, attention=False)
    x = _images(4, seed=3)
    reference = _run(shifted_keys, x)
    res = run_autopilot(
        pre,
        tmp_path / "model.int8.onnx",
        judge=lambda path: compare(reference, _run(path, x), {"max_abs_diff": 1e-4}),
        depth=DEPTH,
        input_name="pixel_values",
        calibration=_images(8, seed=1),
    )
    names = [step.name for step in res.steps]  # the fully quantized graph, the largest, then the ladder
    assert not res.result.quantized_nodes and len(names) > 3
    assert names[2] == "op type Gemm float" and ATTENTION_FLOAT not in names, names
