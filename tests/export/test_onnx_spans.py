"""An ONNX file read without parsing its weights, and written one weight at a time (export/onnx_spans.py):
the file ``onnx.save_model`` writes, byte for byte, also from a file written in pieces (export/onnx.py
``write_streamed``), and each weight read alone is the one ``onnx.load`` reads."""

from __future__ import annotations

import io

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from vitdeploy.export.onnx import write_streamed
from vitdeploy.export.onnx_spans import scan, write


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(64, 64)).astype(np.float32), f"w{i}") for i in range(3)]
    weights.append(numpy_helper.from_array(np.array([2.0], np.float32), "scale"))
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["a"], name="mm0"),
        helper.make_node("MatMul", ["a", "w1"], ["b"], name="mm1"),
        helper.make_node("MatMul", ["b", "w2"], ["c"], name="mm2"),
        helper.make_node("Mul", ["c", "scale"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
        weights,
        doc_string="after the initializers",
    )
    model = helper.make_model(graph, producer_name="test", opset_imports=[helper.make_opsetid("", 18)])
    helper.set_model_props(model, {"k": "v"})  # a field after the graph
    return model


def _saved(model: onnx.ModelProto) -> bytes:
    buf = io.BytesIO()
    onnx.save_model(model, buf)
    return buf.getvalue()


def test_a_scanned_graph_written_again_is_the_file_onnx_writes(tmp_path):
    model = _model()
    for path in (tmp_path / "saved.onnx", tmp_path / "streamed.onnx"):
        if path.name == "saved.onnx":
            onnx.save_model(model, str(path))
        else:
            write_streamed(model, path)  # the graph, then each weight as a graph of its own
        scanned = scan(path)
        assert not scanned.model.graph.initializer and [n.name for n in scanned.model.graph.node] == [
            "mm0",
            "mm1",
            "mm2",
            "mul",
        ]
        assert [s.name for s in scanned.spans] == ["w0", "w1", "w2", "scale"]
        assert scanned.tensor(scanned.spans[1]) == model.graph.initializer[1]
        out = tmp_path / f"again-{path.name}"
        write(scanned.model, [(s.length, lambda s=s: scanned.raw(s)) for s in scanned.spans], out)
        assert out.read_bytes() == _saved(model)


def test_weights_kept_outside_are_spans_of_their_references(tmp_path):
    model = _model()
    path = tmp_path / "external.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="external.onnx.data", size_threshold=0)
    scanned = scan(path)
    tensor = scanned.tensor(scanned.spans[0])
    assert tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data  # read where it lies, on demand
    load_external_data_for_tensor(tensor, str(tmp_path))
    assert np.array_equal(numpy_helper.to_array(tensor), numpy_helper.to_array(_model().graph.initializer[0]))
