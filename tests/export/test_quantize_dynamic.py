"""Dynamic INT8 (``export.int8.mode: dynamic``) keeps in float the nodes it is told to keep in float, and says
what its graph does.

ONNX Runtime's ``quantize_dynamic`` rewrites every Gemm (the classifier head) as a MatMul named
``<gemm>_MatMul`` (and an Add) before it quantizes, so a Gemm excluded by its own name was quantized all the
same, while the result and the manifest said it was float: the autopilot's "op type Gemm float" and "every
MatMul/Gemm float" steps kept the head INT8. Checked here on the written graph itself (its integer weights
and integer ops), on a tiny fused ViT whose head (7 classes) is the only layer with a dimension of 7.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers.tiny_export import FUSED

from vitdeploy.export.int8_autopilot import run_autopilot
from vitdeploy.export.quantize import ORT_CPU, prepare, quantizable_nodes, quantize_prepared

CLASSES = FUSED["num_classes"]
INTEGER_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT32}
INTEGER_OPS = {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLinear", "QGemm"}
INTEGER_OPS |= {"QuantizeLinear", "DequantizeLinear", "ConvInteger"}


@pytest.fixture(scope="module")
def pre(fused_vit, tmp_path_factory) -> Path:
    """The fused tiny ViT pre-processed for dynamic INT8 (its head a Gemm)."""
    dst = tmp_path_factory.mktemp("dynamic") / "pre.onnx"
    return prepare(fused_vit / "model.ort.onnx", dst, optimized=True, mode="dynamic")


def _head(pre: Path) -> str:
    (head,) = quantizable_nodes(pre, ("Gemm",))
    return head


def _integer_ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node if n.op_type in INTEGER_OPS or n.op_type.startswith("QLinear")]


def _head_int8(model) -> bool:
    """Whether an integer weight, zero point or bias of the head (a dimension of 7) is in the graph."""
    return any(CLASSES in t.dims for t in model.graph.initializer if t.data_type in INTEGER_TYPES)


def _head_float(model) -> bool:
    """Whether a float MatMul/Gemm reads the head's float weight (7 x width, or its transpose)."""
    floats = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and CLASSES in t.dims}
    return any(n.op_type in ("MatMul", "Gemm") and floats & set(n.input) for n in model.graph.node)


def _quantize(pre: Path, dst: Path, keep: tuple[str, ...] = ()):
    return quantize_prepared(pre, dst, input_name="pixel_values", mode="dynamic", keep_float=keep)


def test_fully_quantized_dynamic_graph_has_the_head_in_int8(pre, tmp_path):
    """The premise of the checks below: they see an INT8 head where there is one."""
    res = _quantize(pre, tmp_path / "model.int8.onnx")
    model = onnx.load(str(res.path))
    assert _head_int8(model) and not _head_float(model)
    assert res.quantized_nodes == tuple(quantizable_nodes(pre)) and res.keep_float == ()


def test_the_head_kept_float_in_dynamic_mode_is_float_in_the_graph(pre, tmp_path):
    head = _head(pre)
    res = _quantize(pre, tmp_path / "model.int8.onnx", (head,))
    model = onnx.load(str(res.path))
    assert not _head_int8(model) and _head_float(model)
    assert head not in res.quantized_nodes and head in res.keep_float
    others = [n for n in quantizable_nodes(pre) if n != head]
    assert res.quantized_nodes == tuple(others)  # every other MatMul still INT8, and in the graph as such
    assert _integer_ops(model).count("MatMulInteger") == len(others)


def test_every_node_kept_float_in_dynamic_mode_leaves_no_integer_op(pre, tmp_path):
    every = tuple(quantizable_nodes(pre))
    res = _quantize(pre, tmp_path / "model.int8.onnx", every)
    model = onnx.load(str(res.path))
    assert _integer_ops(model) == [] and not _head_int8(model)
    assert res.quantized_nodes == () and set(res.keep_float) == set(every)
    assert res.summary()["quantized_nodes"] == 0
    x = np.random.default_rng(0).normal(size=(2, 3, FUSED["image_size"], FUSED["image_size"])).astype(np.float32)
    answer = [ort.InferenceSession(str(p)).run(None, {"pixel_values": x})[0] for p in (pre, res.path)]
    assert np.abs(answer[0] - answer[1]).max() <= 1e-5  # the float graph's answers


@dataclass
class _Verdict:
    passed: bool
    metrics: dict
    failures: tuple


def test_the_dynamic_autopilot_ships_its_gemm_float_step_with_the_head_float(pre, tmp_path):
    """A gate only a float head passes: the autopilot's "op type Gemm float" step is the one that ships, and
    the graph shipped has its head in float (every step used to keep it INT8: the stage failed its gate)."""
    judged: list[bool] = []

    def judge(path: Path) -> _Verdict:
        judged.append(_head_float(onnx.load(str(path))))
        return _Verdict(judged[-1], {}, () if judged[-1] else ("head in INT8",))

    dst = tmp_path / "model.int8.onnx"
    run = dict(judge=judge, depth=FUSED["depth"], input_name="pixel_values", calibration=None, mode="dynamic")
    result = run_autopilot(pre, dst, placement=ORT_CPU, **run)
    # the fully quantized graph fails; the largest step (looked at first) and the Gemm step pass
    assert result.steps[-1].name == "op type Gemm float" and judged[0] is False and all(judged[1:])
    model = onnx.load(str(dst))
    assert _head_float(model) and not _head_int8(model)
    assert result.result.keep_float == (_head(pre),) and _head(pre) not in result.result.quantized_nodes
