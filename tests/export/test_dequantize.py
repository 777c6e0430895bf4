"""The INT8 autopilot's steps derived from the fully quantized graph (export/dequantize.py) are the very files
``quantize_static`` writes with those nodes excluded: byte for byte, for ONNX Runtime's placement on the fused
graph (model.ort.onnx: its GELU contrib op, a Gemm head with an INT32 bias; and a graph whose fused attention
INT8 writes out, its products' keys and values signed by TensorQuantOverrides, with the autopilot's
"attention float" steps) and for TensorRT's on the plain graph (Conv, no quantized bias), inline and with
external data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.tiny_export import FUSED, TINY, fused_tiny_vit

from vitdeploy.export.autopilot import block_spans
from vitdeploy.export.dequantize import dequantize
from vitdeploy.export.int8_attention import attention_products
from vitdeploy.export.optimize import optimize_for_ort
from vitdeploy.export.quantize import ORT_CPU, TENSORRT, prepare, quantize_prepared


def _files(path: Path) -> list[bytes]:
    data = path.with_name(path.name + ".data")
    return [path.read_bytes()] + ([data.read_bytes()] if data.is_file() else [])


@pytest.fixture(scope="module")
def graphs(tiny_artifacts, tmp_path_factory) -> dict[str, Path]:
    """The tiny ViT's plain graph, ONNX Runtime's fused graph of it, and a fused graph with MultiHeadAttention."""
    plain = tiny_artifacts() / "model.onnx"
    out = tmp_path_factory.mktemp("fused") / "model.ort.onnx"
    fused = optimize_for_ort(plain, out, num_heads=TINY["heads"], hidden_size=TINY["width"])
    return {"plain": plain, "fused": fused, "attention": fused_tiny_vit(tmp_path_factory.mktemp("attention"))}


@pytest.mark.parametrize(
    "placement, graph, external",
    [
        (ORT_CPU, "fused", False),
        (ORT_CPU, "fused", True),
        (ORT_CPU, "attention", False),
        (ORT_CPU, "attention", True),
        (TENSORRT, "plain", False),
    ],
)
def test_a_step_derived_from_the_quantized_graph_is_the_file_quantize_static_writes(
    graphs, tmp_path, placement, graph, external
):
    src, fused, attention = graphs[graph], graph != "plain", graph == "attention"
    pre = prepare(
        src, tmp_path / "pre.onnx", placement=placement, optimized=fused, external_data=external, attention=attention
    )
    side = FUSED["image_size"] if attention else TINY["image_size"]
    calib = np.random.default_rng(0).normal(size=(4, 3, side, side)).astype(np.float32)
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
    steps = [first, [*first, *blocks[1]], blocks[0], [*first, *blocks[0], *blocks[1]]]
    products = list(attention_products(model))
    assert bool(products) == attention and set(products) == set(full.attention)
    if attention:  # the autopilot's ladder (attention float, the head, a block), then a block's attention alone
        steps = [products, [*products, *first], [*products, *first, *blocks[1]], blocks[0], products[:2]]
        assert set(products[:2]) < set(blocks[0])
    for keep in steps:
        direct = quantize_prepared(pre, tmp_path / "direct" / "model.int8.onnx", keep_float=keep, **args)
        derived = tmp_path / "derived" / "model.int8.onnx"
        ops, before = placement.op_types, full.keep_float
        assert dequantize(
            full.path, pre, derived, keep_float=keep, before=before, op_types=ops, external_data=external
        )
        assert _files(derived) == _files(direct.path), keep
        assert len(_files(derived)) == (2 if external else 1)
