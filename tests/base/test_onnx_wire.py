"""A graph read for its structure without its weights' values (base/onnx_wire.py ``light_model``): the model
``export/onnx.py``'s ``without_weights`` makes of the loaded file, whether the weights lie inline or in an
external data file (their entries kept: what the external-data check reads), and a truncated file refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.base.onnx_wire import light_model
from vitdeploy.export.onnx import without_weights


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(96, 64)).astype(np.float32), "w")
    table = numpy_helper.from_array(rng.normal(size=(1, 5, 64)).astype(np.float32), "table")  # 3-D: kept whole
    shape = numpy_helper.from_array(np.array([-1, 64], np.int64), "shape")  # what shape inference reads
    nodes = [
        helper.make_node("Add", ["x", "table"], ["a"], name="add"),
        helper.make_node("Reshape", ["a", "shape"], ["b"], name="flat"),
        helper.make_node("MatMul", ["w", "b"], ["y"], name="mm", doc_string="weight first"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [96, None])],
        [weight, table, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    helper.set_model_props(model, {"k": "v"})
    return model


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_the_light_model_is_the_loaded_model_without_its_weight_matrices(tmp_path, external):
    path = tmp_path / "m.onnx"
    if external:
        onnx.save_model(_model(), str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    else:
        onnx.save_model(_model(), str(path))
    loaded = onnx.load(str(path), load_external_data=False)

    light = light_model(path)

    if not external:  # the same bytes as the loaded model stripped in memory
        assert light.SerializeToString() == without_weights(loaded).SerializeToString()
    weight = next(t for t in light.graph.initializer if t.name == "w")
    assert list(weight.dims) == [96, 64] and not weight.raw_data and not weight.float_data
    if external:  # the entries the external-data check reads stay, for every tensor
        for ours, theirs in zip(light.graph.initializer, loaded.graph.initializer):
            assert ours.data_location == TensorProto.EXTERNAL
            assert list(ours.external_data) == list(theirs.external_data)
    else:  # what is not a weight matrix is whole
        kept = {t.name: numpy_helper.to_array(t) for t in light.graph.initializer if t.name != "w"}
        np.testing.assert_array_equal(kept["shape"], [-1, 64])
        assert kept["table"].shape == (1, 5, 64)
    assert [n.name for n in light.graph.node] == ["add", "flat", "mm"]
    assert {p.key: p.value for p in light.metadata_props} == {"k": "v"}


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save_model(_model(), str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # cut inside the weight's values

    with pytest.raises(ValueError, match="truncated"):
        light_model(path)
