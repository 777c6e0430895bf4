"""The INT8 autopilot returns blocks to float widest first: the widths come from the ranges the
calibration already measured (export/autopilot.py ``range_peaks``), and give the order that running
the graph again over the calibration images gives (``activation_peaks``)."""

from __future__ import annotations

import onnx
import pytest

from vitdeploy.demo import IMAGES_DIR
from vitdeploy.export.autopilot import block_spans, range_peaks, widest_first
from vitdeploy.export.precision import activation_peaks
from vitdeploy.export.quantize import prepare, quantize_prepared
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.preprocess import Preprocessor

pytestmark = pytest.mark.integration


def test_blocks_are_ordered_from_the_calibrated_ranges_as_from_the_activations(demo_artifacts, tmp_path):
    artifacts = Artifacts.open(demo_artifacts)
    paths = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))[:16]
    calib = Preprocessor(artifacts.preprocess).batch(paths)
    pre = prepare(demo_artifacts / "model.ort.onnx", tmp_path / "pre.onnx", optimized=True)
    ranges = tmp_path / "ranges.json"
    assert range_peaks(onnx.load(str(pre), load_external_data=False), ranges) == {}  # not calibrated yet
    quantize_prepared(pre, tmp_path / "q.onnx", input_name=artifacts.input_name, calibration=calib, ranges=ranges)
    model = onnx.load(str(pre), load_external_data=False)
    depth = int(artifacts.manifest["model"]["vit"]["depth"])
    kind = {n.name: n.op_type for n in model.graph.node}
    spans = [[n for n in span if kind[n] in ("MatMul", "Gemm")] for span in block_spans(model, depth)]
    assert sum(map(len, spans)) > depth >= 2  # blocks with quantized nodes to order
    from_ranges = range_peaks(model, ranges)
    from_activations = activation_peaks(pre, calib, artifacts.input_name)
    assert from_ranges and set(from_ranges) <= set(from_activations)
    for node, peak in from_ranges.items():  # the same magnitudes (up to the last bits of another session)
        assert peak == pytest.approx(from_activations[node], rel=1e-5)
    assert widest_first(model, spans, from_ranges) == widest_first(model, spans, from_activations)
