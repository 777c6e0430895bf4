"""export/probe.py: the numbers reduced inside ONNX Runtime are those of the values themselves, and a
value that is not finite is seen as such (ONNX Runtime's ReduceMax skips NaN; the probe must not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from vitdeploy.export.precision import activation_peaks  # noqa: E402
from vitdeploy.export.probe import float_values, reduce_values  # noqa: E402


def _graph(folder: Path) -> Path:
    """x -> scaled = x * w (a weight matrix's worth of values) -> logged = Log(scaled): NaN where
    ``scaled`` is negative, -inf where it is 0."""
    w = numpy_helper.from_array(np.linspace(-2, 3, 4 * 5, dtype=np.float32).reshape(4, 5), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["scaled"], name="scale"),
        helper.make_node("Log", ["scaled"], ["logged"], name="log"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("logged", TensorProto.FLOAT, ["n", 5])],
        initializer=[w],
    )
    path = folder / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _values(x: np.ndarray) -> dict[str, np.ndarray]:
    scaled = x @ np.linspace(-2, 3, 20, dtype=np.float32).reshape(4, 5)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"x": x, "scaled": scaled, "logged": np.log(scaled)}


def test_each_statistic_is_the_values_own_and_nan_or_inf_is_never_skipped(tmp_path):
    path = _graph(tmp_path)
    x = np.abs(np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32))
    x[3] = 0.0  # a run whose logged value is -inf everywhere
    wanted = {name: ("min", "max", "sum") for name in ("x", "scaled", "logged")}
    runs = list(reduce_values(path, x, "x", wanted, batch=2))
    assert len(runs) == 3
    for i, run in enumerate(runs):
        for name, value in _values(x[2 * i : 2 * i + 2]).items():
            if np.all(np.isfinite(value)):
                assert np.isclose(run[name]["min"], value.min()) and np.isclose(run[name]["max"], value.max())
                assert np.isclose(run[name]["sum"], value.sum(), rtol=1e-5)
            else:  # ``logged``: NaN where x @ w < 0 (some columns of w are negative), -inf in run 1
                assert not np.isfinite(run[name]["sum"]), (i, name)
    assert not list(tmp_path.glob(".probe-*")), "the probe graph and its weights are removed"


def test_activation_peaks_name_the_producing_node_and_a_nan_output_is_hot(tmp_path):
    path = _graph(tmp_path)
    x = np.abs(np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32))
    peaks = activation_peaks(path, x, "x")
    assert set(peaks) == {"scale", "log"}
    assert np.isclose(peaks["scale"], np.abs(_values(x)["scaled"]).max())
    assert peaks["log"] == float("inf")  # Log of a negative value: NaN, never a finite peak


def test_float_values_are_typed_without_loading_the_weights(tmp_path):
    model = onnx.load(str(_graph(tmp_path)))
    assert float_values(model) == {n: TensorProto.FLOAT for n in ("x", "scaled", "logged")}


def test_weights_read_where_they_lie_give_the_same_numbers_as_the_graph_loaded_whole(tmp_path):
    from vitdeploy.base.onnx_wire import in_place_model

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")  # a weight matrix
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Relu", ["y"], ["r"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", 8])],
        initializer=[w],
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    x = rng.standard_normal((4, 16)).astype(np.float32)
    wanted = {name: ("min", "max", "sum") for name in ("x", "y", "r")}
    model = in_place_model(path)
    (weight,) = model.graph.initializer
    assert weight.data_location == TensorProto.EXTERNAL and not weight.raw_data  # its bytes stay in g.onnx
    assert {e.key: e.value for e in weight.external_data}["location"] == path.name

    in_place = list(reduce_values(path, x, "x", wanted, batch=2, model=model))
    loaded = list(reduce_values(path, x, "x", wanted, batch=2, model=onnx.load(str(path))))

    assert in_place == loaded and len(in_place) == 2
    assert np.isclose(max(run["y"]["max"] for run in in_place), (x @ numpy_helper.to_array(w)).max())
    assert not list(tmp_path.glob(".probe-*")), "the probe graph is removed"
