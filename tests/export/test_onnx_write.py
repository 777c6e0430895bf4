"""Writing a graph one weight at a time (export/onnx.py ``write_streamed``) gives the very model
``onnx.save_model`` would: every field of the model and its graph, every initializer in order."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.export.onnx import write_streamed


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}") for i in range(3)]
    shape = numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"], name="m0"),
        helper.make_node("MatMul", ["h0", "w1"], ["h1"], name="m1"),
        helper.make_node("MatMul", ["h1", "w2"], ["h2"], name="m2"),
        helper.make_node("Reshape", ["h2", "shape"], ["y"], name="r"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])],
        initializer=[*weights, shape],
        value_info=[helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["batch", 8])],
        doc_string="a graph",
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="test", ir_version=10
    )  # IR 10: what torch writes; any ONNX Runtime >= 1.18 loads it
    model.doc_string = "a model"
    helper.set_model_props(model, {"vitdeploy.name": "m", "other": "x"})
    return model


def test_the_streamed_file_is_the_model(tmp_path):
    model = _model()
    write_streamed(model, tmp_path / "streamed.onnx")
    onnx.save_model(model, str(tmp_path / "saved.onnx"))
    streamed, saved = onnx.load(str(tmp_path / "streamed.onnx")), onnx.load(str(tmp_path / "saved.onnx"))
    assert streamed == saved == model
    assert [t.name for t in streamed.graph.initializer] == ["w0", "w1", "w2", "shape"]
    onnx.checker.check_model(str(tmp_path / "streamed.onnx"), full_check=True)

    import onnxruntime as ort

    x = np.ones((1, 8), np.float32)
    run = [
        ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        for name in ("streamed.onnx", "saved.onnx")
    ]
    np.testing.assert_array_equal(run[0], run[1])
