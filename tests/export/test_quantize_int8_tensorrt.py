"""model.int8.trt.onnx: the Q/DQ graph TensorRT builds its INT8 engine from, checked where a CPU can.

What a user relies on: with ``export.int8.tensorrt: true`` the export writes it from the plain graph
(model.onnx), calibrated on the same validation images as model.int8.onnx, and it is a graph
TensorRT's explicit quantization takes (S8 symmetric, zero points 0, positive scales, per-channel
weights, Q/DQ on the inputs of MatMul/Gemm/Conv only, standard ops only) whose answers, run by
ONNX Runtime on the CPU, stay within validation.int8 of eager PyTorch. The engine itself needs
TensorRT: tests/runtime/test_trt_engine_gpu.py builds one from this graph where TensorRT exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from vitdeploy.base.config import parse_config
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.export.compare import logit_metrics
from vitdeploy.export.pipeline import run_export
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.backends import BackendOptions, open_backend
from vitdeploy.runtime.backends.ort import OrtBackend
from vitdeploy.runtime.preprocess import Preprocessor

pytestmark = pytest.mark.integration

CPU1 = BackendOptions(device="cpu", providers=("CPUExecutionProvider",), threads=1)
FP16_OPS = Path(__file__).resolve().parents[1] / "data" / "tensorrt" / "onnx-tensorrt-fp16-ops.txt"
WEIGHTED = ("MatMul", "Gemm", "Conv")


@pytest.fixture(scope="module")
def trt_export(tmp_path_factory) -> Path:
    """The demo model with only what this file needs: model.onnx and model.int8.trt.onnx."""
    out = tmp_path_factory.mktemp("int8_trt")
    cfg = parse_config(
        {"export": {"optimize": False, "fp16": {"enabled": False}, "int8": {"enabled": False, "tensorrt": True}}}, None
    )
    run_export(cfg, out, engine="skip", heartbeat_s=None)
    return out


@pytest.fixture(scope="module")
def graph(trt_export) -> onnx.ModelProto:
    return onnx.load(str(trt_export / "model.int8.trt.onnx"))


def _images(artifacts: Artifacts) -> np.ndarray:
    paths = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))
    return Preprocessor(artifacts.preprocess).batch(paths)


def test_written_from_the_plain_graph_calibrated_like_the_ort_int8_graph(trt_export):
    manifest = json.loads((trt_export / "manifest.json").read_text())
    record = manifest["export"]["int8_tensorrt"]
    assert (
        "onnx-int8-trt" in manifest["artifacts"]
        and manifest["artifacts"]["onnx-int8-trt"]["path"] == "model.int8.trt.onnx"
    )
    assert record["source"] == "model.onnx" and record["placement"] == "tensorrt" and record["passed"] is True
    assert record["activations"] == "int8 symmetric" and record["bias"] == "float"
    images = manifest["validation_inputs"]["images"]
    assert record["calibration_images"] == min(images, 64) > 0  # the real validation images, never the noise rows
    assert manifest["validation"]["validate-int8-trt"]["passed"] is True
    assert "onnx-int8" not in manifest["artifacts"]  # export.int8.enabled: false only drops the ORT graph


def test_every_weighted_op_reads_quantized_inputs_and_no_output_is_requantized(graph):
    producer = {out: n for n in graph.graph.node for out in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    weighted = [n for n in graph.graph.node if n.op_type in WEIGHTED]
    assert {n.op_type for n in weighted} == set(WEIGHTED)
    for node in weighted:
        data_inputs = node.input[:2]  # X and W (A and B); a Gemm / Conv bias stays float
        assert all(producer[i].op_type == "DequantizeLinear" for i in data_inputs), node.name
        assert not any(c.op_type == "QuantizeLinear" for out in node.output for c in consumers.get(out, [])), node.name
        if len(node.input) > 2:
            assert node.input[2] not in producer  # a float initializer: TensorRT's Q/DQ take no INT32 bias
    # every Q/DQ pair feeds a weighted op: nothing else reads quantized values (a Shape reads only the shape)
    for dq in (n for n in graph.graph.node if n.op_type == "DequantizeLinear"):
        assert {c.op_type for c in consumers[dq.output[0]]} - {"Shape"} <= set(WEIGHTED)


def test_quantization_is_what_tensorrt_explicit_quantization_takes(graph):
    """onnx-tensorrt (docs/operators.md): QuantizeLinear `y_zero_point` must be 0, DequantizeLinear
    INT8 with `x_zero_point` zero; TensorRT's IDequantizeLayer: scales strictly positive, a 1-D scale
    as long as the quantization axis for per-channel weights."""
    inits = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    qdq = [n for n in graph.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq
    for node in qdq:
        scale, zero = inits[node.input[1]], inits[node.input[2]]
        assert zero.dtype == np.int8 and not zero.any(), f"{node.name}: S8 with zero point 0 (symmetric)"
        assert scale.dtype == np.float32 and (scale > 0).all() and np.isfinite(scale).all(), node.name
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:  # a weight: INT8, per channel
            weight = inits[node.input[0]]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            assert weight.dtype == np.int8 and scale.shape == (weight.shape[axis],), node.name
    weight_dqs = [n for n in qdq if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert (
        len(weight_dqs) == sum(n.op_type in WEIGHTED for n in graph.graph.node) - 8
    )  # 8 attention MatMuls: two activations


def test_standard_ops_only_at_an_opset_tensorrt_parses(graph):
    lines = FP16_OPS.read_text(encoding="utf-8").splitlines()
    _, _, low, high = lines[0].split()
    listed = {line.strip() for line in lines[1:] if line.strip()}
    assert all(n.domain in ("", "ai.onnx") for n in graph.graph.node), "contrib ops never parse in TensorRT"
    (opset,) = [o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")]
    assert int(low) <= opset <= int(high)
    # the float ops run in FP32 there; DequantizeLinear is listed for INT8 (not FP16) in the same matrix
    assert {n.op_type for n in graph.graph.node} - {"DequantizeLinear"} <= listed
    inputs = {i.name: i.type.tensor_type.elem_type for i in graph.graph.input}
    outputs = {o.name: o.type.tensor_type.elem_type for o in graph.graph.output}
    assert inputs == {"pixel_values": TensorProto.FLOAT} and outputs == {"logits": TensorProto.FLOAT}


def test_drift_on_the_cpu_within_validation_int8_and_batch_invariant(trt_export):
    """Run by ONNX Runtime on the CPU against eager PyTorch on the demo images (issue 14 measured 0
    flips / cosine 0.9987 for this placement on its augmented set; here: 40 images)."""
    artifacts = Artifacts.open(trt_export)
    batch = _images(artifacts)
    backend = OrtBackend(trt_export / "model.int8.trt.onnx", artifacts.input_shape, None, CPU1, name="ort")
    reference = open_backend("torch", artifacts, BackendOptions(device="cpu"))
    fp32 = open_backend("ort", artifacts, CPU1)
    try:
        got, want, plain = backend.run(batch), reference.run(batch), fp32.run(batch)
        alone = np.concatenate([backend.run(batch[i : i + 1]) for i in range(8)])
    finally:
        for b in (backend, reference, fp32):
            b.close()
    metrics, flipped = logit_metrics(want, got)
    assert flipped == () and metrics["top1_agreement"] == 1.0
    assert metrics["cosine"] >= 0.99 and metrics["max_abs_diff"] <= 1.0  # validation.int8's defaults
    assert np.abs(got - plain).max() > 1e-3  # it is quantized, not the FP32 graph under another name
    assert np.abs(alone - got[:8]).max() <= 1e-6  # static ranges: an image's answer does not depend on its batch
