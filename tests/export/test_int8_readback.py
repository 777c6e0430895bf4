"""An INT8 result reports what its graph does (export/int8_readback.py): the nodes it says are INT8 are computed
in integers in the written graph, the others in float, for both placements and both modes; a node ONNX
Runtime leaves in float on its own is reported float; and a graph that quantizes a node it was told to keep
in float is refused, not shipped under a float claim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.tiny_export import FUSED

from vitdeploy.base.errors import ExportError
from vitdeploy.export import quantize
from vitdeploy.export.int8_attention import attention_products
from vitdeploy.export.int8_readback import quantized_in_graph
from vitdeploy.export.quantize import ORT_CPU, TENSORRT, prepare, quantizable_nodes, quantize_prepared

SIDE = FUSED["image_size"]
CALIBRATION = np.random.default_rng(0).normal(size=(4, 3, SIDE, SIDE)).astype(np.float32)


@pytest.fixture
def folder(fused_vit) -> Path:
    """model.onnx and model.ort.onnx (fused, its attention a MultiHeadAttention) of a tiny ViT."""
    return fused_vit


def _quantize(pre: Path, dst: Path, **kwargs):
    return quantize_prepared(pre, dst, input_name="pixel_values", calibration=CALIBRATION, **kwargs)


def test_static_results_report_the_nodes_their_graph_quantizes(folder, tmp_path):
    """ONNX Runtime's graph, its attention written out (its Q·Kᵀ and weights·V quantized too), then with the
    head, a block's two products and one projection in float; TensorRT's graph (its Conv too)."""
    pre = prepare(folder / "model.ort.onnx", tmp_path / "pre.onnx", optimized=True, attention=True)
    every, products = quantizable_nodes(pre), list(attention_products(onnx.load(str(pre))))
    full = _quantize(pre, tmp_path / "full.onnx")
    assert len(products) == 4 and full.quantized_nodes == tuple(every) and set(full.attention) == set(products)
    keep = (*quantizable_nodes(pre, ("Gemm",)), *products[:2], every[0])
    some = _quantize(pre, tmp_path / "some.onnx", keep_float=keep)
    assert some.quantized_nodes == tuple(n for n in every if n not in keep) and some.keep_float == keep
    assert set(some.attention) == set(products[2:])
    plain = prepare(folder / "model.onnx", tmp_path / "plain.onnx", placement=TENSORRT)
    trt = _quantize(plain, tmp_path / "trt.onnx", placement=TENSORRT)
    conv = quantizable_nodes(plain, ("Conv",))
    assert conv and trt.quantized_nodes == tuple(quantizable_nodes(plain, TENSORRT.op_types))


def test_a_matmul_dynamic_quantization_leaves_float_is_reported_float(folder, tmp_path):
    """Dynamic INT8 quantizes a MatMul only when its second operand is a weight: the attention products
    written out stay float, and the result says so (it used to count them INT8)."""
    pre = prepare(folder / "model.ort.onnx", tmp_path / "pre.onnx", optimized=True, attention=True)
    products = attention_products(onnx.load(str(pre)))
    res = quantize_prepared(pre, tmp_path / "model.int8.onnx", input_name="pixel_values", mode="dynamic")
    assert set(res.keep_float) == set(products) and not set(products) & set(res.quantized_nodes)
    assert res.quantized_nodes == tuple(n for n in quantizable_nodes(pre) if n not in products)
    assert res.summary()["quantized_nodes"] == len(res.quantized_nodes) and res.attention == ()


def test_a_graph_that_quantizes_a_node_kept_float_is_refused(folder, tmp_path, monkeypatch):
    """The read-back's guard: dynamic INT8 told the Gemm head's name alone (as before the fix) quantizes it
    under its new name; the stage fails naming the head, and nothing is written."""
    pre = prepare(folder / "model.ort.onnx", tmp_path / "pre.onnx", optimized=True, mode="dynamic")
    (head,) = quantizable_nodes(pre, ("Gemm",))
    monkeypatch.setattr(quantize, "_dynamic_exclusions", lambda pre, keep: list(keep))
    dst = tmp_path / "model.int8.onnx"
    with pytest.raises(ExportError, match=f"quantized 1 node.* told to keep in float \\({head}\\)"):
        quantize_prepared(pre, dst, input_name="pixel_values", mode="dynamic", keep_float=(head,))
    assert not dst.exists()


def test_a_graph_not_quantized_from_the_source_is_refused(folder):
    """A written graph that does not write a source node's output is not read as float."""
    source = onnx.load(str(folder / "model.ort.onnx"), load_external_data=False)
    other = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    with pytest.raises(ExportError, match="nothing in the quantized graph writes"):
        quantized_in_graph(other, source, ORT_CPU.op_types)
