"""model.fp16.onnx is what TensorRT's ONNX parser will be given: is it parseable, as far as a CPU
can tell? Checked against tests/data/tensorrt/onnx-tensorrt-fp16-ops.txt (onnx-tensorrt's own
support matrix, see the README there):

- every node is a standard ONNX op that onnx-tensorrt supports in FP16 (no com.microsoft ops:
  those belong to model.ort.onnx, never to TensorRT);
- the default-domain opset is inside the range the matrix states;
- no DOUBLE tensor anywhere (TensorRT casts DOUBLE down, clamping);
- graph input and output are FLOAT and named as the manifest says;
- each LayerNormalization's inputs (X, scale, bias) share one element type (strongly typed
  networks reject mixed types).

This is not a TensorRT parse: tests/runtime/test_trt_engine_gpu.py builds an engine from this very file where a
GPU exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

pytestmark = pytest.mark.integration

OPS_FILE = Path(__file__).resolve().parents[1] / "data" / "tensorrt" / "onnx-tensorrt-fp16-ops.txt"


def supported() -> tuple[set[str], int, int]:
    lines = OPS_FILE.read_text(encoding="utf-8").splitlines()
    _, _, low, high = lines[0].split()
    return {line.strip() for line in lines[1:] if line.strip()}, int(low), int(high)


@pytest.fixture(scope="module")
def graph(demo_artifacts):
    model = onnx.load(str(demo_artifacts / "model.fp16.onnx"))
    inferred = onnx.shape_inference.infer_shapes(model)
    manifest = json.loads((demo_artifacts / "manifest.json").read_text())
    return model, inferred, manifest


def _types(inferred: onnx.ModelProto) -> dict[str, int]:
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for info in [*g.input, *g.output, *g.value_info]:
        types[info.name] = info.type.tensor_type.elem_type
    return types


def test_every_op_is_supported_by_onnx_tensorrt_in_fp16(graph):
    model, _, _ = graph
    ops, _, _ = supported()
    foreign = sorted({f"{n.domain}:{n.op_type}" for n in model.graph.node if n.domain not in ("", "ai.onnx")})
    assert foreign == [], f"non-standard ops TensorRT cannot parse: {foreign}"
    used = {n.op_type for n in model.graph.node}
    assert used, "the graph has no nodes"
    assert used <= ops, f"ops onnx-tensorrt does not list as FP16-capable: {sorted(used - ops)}"


def test_opset_in_the_range_tensorrt_parses(graph):
    model, _, _ = graph
    _, low, high = supported()
    (opset,) = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    assert low <= opset <= high


def test_no_double_tensors(graph):
    model, inferred, _ = graph
    doubles = [name for name, t in _types(inferred).items() if t == TensorProto.DOUBLE]
    casts = [
        n.name
        for n in model.graph.node
        if n.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.DOUBLE for a in n.attribute)
    ]
    assert doubles == [] and casts == []


def test_float_io_named_as_the_manifest_says(graph):
    model, _, manifest = graph
    io = manifest["io"]
    (inp,) = model.graph.input
    outputs = {o.name: o for o in model.graph.output}
    assert inp.name == io["input"]["name"] and inp.type.tensor_type.elem_type == TensorProto.FLOAT
    assert io["output"]["name"] in outputs
    assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in outputs.values())


def test_each_layernorm_has_inputs_of_one_type(graph):
    model, inferred, _ = graph
    types = _types(inferred)
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert norms, "expected LayerNormalization nodes (opset >= 17)"
    for node in norms:
        kinds = {types.get(name) for name in node.input if name}
        assert len(kinds) == 1 and None not in kinds, f"{node.name}: inputs {list(node.input)} have types {kinds}"
