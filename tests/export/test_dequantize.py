"""The INT8 autopilot's steps derived from the fully quantized graph (export/dequantize.py) are the very files
``quantize_static`` writes with those nodes excluded: byte for byte, for ONNX Runtime's placement on the fused
graph (model.ort.onnx: its attention and GELU contrib ops, a Gemm head with an INT32 bias) and for TensorRT's on
the plain graph (Conv, no quantized bias), inline and with external data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.tiny_export import TINY

from vitdeploy.export.autopilot import block_spans
from vitdeploy.export.dequantize import dequantize
from vitdeploy.export.optimize import optimize_for_ort
from vitdeploy.export.quantize import ORT_CPU, TENSORRT, prepare, quantize_prepared


def _files(path: Path) -> list[bytes]:
    data = path.with_name(path.name + ".data")
    return [path.read_bytes()] + ([data.read_bytes()] if data.is_file() else [])


@pytest.fixture(scope="module")
def graphs(tiny_artifacts, tmp_path_factory) -> dict[bool, Path]:
    """The tiny ViT's plain graph (False) and ONNX Runtime's fused graph of it (True)."""
    plain = tiny_artifacts() / "model.onnx"
    out = tmp_path_factory.mktemp("fused") / "model.ort.onnx"
    return {False: plain, True: optimize_for_ort(plain, out, num_heads=TINY["heads"], hidden_size=TINY["width"])}


@pytest.mark.parametrize(
    "placement, fused, external", [(ORT_CPU, True, False), (ORT_CPU, True, True), (TENSORRT, False, False)]
)
def test_a_step_derived_from_the_quantized_graph_is_the_file_quantize_static_writes(
    graphs, tmp_path, placement, fused, external
):
    src = graphs[fused]
    pre = prepare(src, tmp_path / "pre.onnx", placement=placement, optimized=fused, external_data=external)
    calib = np.random.default_rng(0).normal(size=(4, 3, TINY["image_size"], TINY["image_size"])).astype(np.float32)
    args = dict(input_name="pixel_values", calibration=calib, placement=placement, external_data=external)
    args["ranges"] = tmp_path / "ranges.json"
    for folder in ("full", "direct", "derived"):
        (tmp_path / folder).mkdir()
    full = quantize_prepared(pre, tmp_path / "full" / "model.int8.onnx", **args)
    model = onnx.load(str(pre), load_external_data=False)
    kind = {n.name: n.op_type for n in model.graph.node}
    blocks = [[n for n in span if kind[n] in placement.op_types] for span in block_spans(model, TINY["depth"])]
    first = [n for n in kind if kind[n] in placement.float_first]
    assert first and blocks[0] and blocks[1]
    for keep in (first, [*first, *blocks[1]], blocks[0], [*first, *blocks[0], *blocks[1]]):
        direct = quantize_prepared(pre, tmp_path / "direct" / "model.int8.onnx", keep_float=keep, **args)
        derived = tmp_path / "derived" / "model.int8.onnx"
        ops, before = placement.op_types, full.keep_float
        assert dequantize(
            full.path, pre, derived, keep_float=keep, before=before, op_types=ops, external_data=external
        )
        assert _files(derived) == _files(direct.path), keep
        assert len(_files(derived)) == (2 if external else 1)
