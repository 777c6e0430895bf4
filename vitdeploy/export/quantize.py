"""Stage: the INT8 graph ONNX Runtime runs on the CPU (``model.int8.onnx``).

Quantized from the fused FP32 graph (``model.ort.onnx``) with ONNX Runtime's own quantization
tools, never by hand:

- ``quant_pre_process`` first (symbolic shape inference through the contrib ops; without it some
  MatMuls of a fused graph are silently left in float);
- static mode (the default): QDQ, U8 activations (S8 activations leave the fused q/k/v
  projections in float on x86), S8 symmetric per-channel weights (U8 weights run 2x slower),
  MatMul and Gemm only, their outputs not re-quantized (2-4x the error for no speed), ranges
  calibrated on real validation images (MinMax by default; never ``CalibMaxIntermediateOutputs``,
  which drops calibration data in ORT 1.32). Activation ranges are fixed in the graph, so an
  image's answer does not depend on the other images in its batch;
- attention too (:data:`ORT_CPU`'s ``attention``): the fused graph's ``MultiHeadAttention`` is
  written out again (export/int8_attention.py) so that its Q·Kᵀ and weights·V are MatMuls like the
  others, their keys and values S8 symmetric (per tensor); softmax, LayerNorm and GELU stay float
  (ONNX Runtime's CPU has no integer GELU or LayerNorm, and its ``QLinearSoftmax`` took 7x the float
  softmax's time). docs/precision.md has the measurements;
- dynamic mode (opt-in): no calibration, activation ranges computed per batch at run time, so an
  image's logits move with the other images in its batch (up to 0.08 on ViT-B/16): under dynamic
  batching one user's answer would depend on other users' requests.

The graph TensorRT builds into an INT8 engine (``model.int8.trt.onnx``) is quantized by the same
code with another :class:`Placement` (:data:`TENSORRT`), from the plain graph ``model.onnx``
(TensorRT fuses on its own; the fused graph's contrib ops do not parse there). TensorRT's explicit
quantization is symmetric and signed only, so activations are S8 symmetric too; Q/DQ sit on the
inputs of the weighted ops alone. Followed (NVIDIA TensorRT developer guide, "Explicit
Quantization", https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/quantized-types-explicit-quantization.html,
section "Q/DQ Layer-Placement Recommendations"): quantize all inputs of weighted operations
(Convolution and GEMM: Conv, MatMul, Gemm), do not quantize their outputs by default; and the
IQuantizeLayer / IDequantizeLayer contract (C++ API reference): zero points all zero (symmetric
only), scales strictly positive, a 1-D scale along the channel axis for per-channel weights.
Biases stay float (``QuantizeBias`` off): TensorRT's Q/DQ take 8-bit (and smaller) types, not the
INT32 bias ONNX Runtime would write.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..base._deps import require
from ..base._files import atomic_path
from ..base.errors import ConfigError, ExportError, StageUnavailableError, first_line
from ..base.onnx_wire import light_model
from ..runtime.backends.ort import INT8_SESSION_CONFIG
from .int8_attention import (
    attention_products,
    has_fused_attention,
    pays,
    signed_operands,
    write_out_attention,
    written_out_copy,
)
from .int8_calibration import calibrate_minmax, calibration_cache, calibration_reader
from .int8_readback import read_quantized_nodes

log = logging.getLogger(__name__)

QUANTIZED_OPS = ("MatMul", "Gemm")


@dataclass(frozen=True)
class Placement:
    """Where the Q/DQ pairs go and in which types: one per runtime that executes an INT8 graph."""

    name: str
    op_types: tuple[str, ...]  # the ops whose inputs are quantized (their outputs never are)
    activations: str  # "uint8" | "int8"
    symmetric_activations: bool
    quantize_bias: bool  # Gemm/Conv biases as INT32 + DequantizeLinear
    optimize_first: bool  # quant_pre_process runs ONNX Runtime's basic optimiser before quantizing
    float_first: tuple[str, ...]  # op types the autopilot returns to float before going block by block
    # fused attention (MultiHeadAttention) written out so that its Q·Kᵀ and weights·V are quantized too
    # (export/int8_attention.py), their keys and values signed symmetric INT8
    attention: bool = False
    # the ONNX Runtime session settings the graph is meant to run with (runtime/backends/ort.py)
    session_config: tuple[tuple[str, str], ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "placement": self.name,
            "quantized_ops": list(self.op_types),
            "activations": f"{self.activations} {'symmetric' if self.symmetric_activations else 'asymmetric'}",
            "weights": "int8 symmetric per channel",
            "bias": "int32" if self.quantize_bias else "float",
        }


#: model.int8.onnx for ONNX Runtime on x86 (see the module docstring for each choice).
ORT_CPU = Placement("onnxruntime-cpu", QUANTIZED_OPS, "uint8", False, True, True, ("Gemm",), True, INT8_SESSION_CONFIG)
#: model.int8.trt.onnx for TensorRT's explicit quantization (the classifier head and the patch
#: embedding, the layers nearest the output and the input, are the first returned to float).
TENSORRT = Placement("tensorrt", ("MatMul", "Gemm", "Conv"), "int8", True, False, False, ("Gemm", "Conv"))
DYNAMIC_CAVEAT = (
    "export.int8.mode is dynamic: activation ranges are computed per batch, so an image's answer "
    "depends on the other images in its batch (under `serve`'s dynamic batching, on other users' "
    "requests); use mode: static for batch-invariant answers"
)
_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


@dataclass(frozen=True)
class Int8Result:
    path: Path
    mode: str
    method: str | None
    calibration_images: int
    quantized_nodes: tuple[str, ...]
    keep_float: tuple[str, ...] = ()
    external_data: tuple[Path, ...] = field(default_factory=tuple)
    placement: Placement = ORT_CPU
    attention: tuple[str, ...] = ()  # the attention products quantized (export/int8_attention.py)

    def summary(self) -> dict[str, Any]:
        described = self.placement.describe()
        if self.mode != "static":
            described["activations"] += " (per batch)"
        if self.attention:
            described["attention"] = (
                f"Q·Kᵀ and weights·V INT8 in {len(self.attention) // 2} block(s) (keys, values int8 symmetric), "
                "softmax float"
            )
        return {
            "mode": self.mode,
            "calibration_method": self.method,
            "calibration_images": self.calibration_images,
            **described,
            "quantized_nodes": len(self.quantized_nodes),
            "keep_float": list(self.keep_float),
        }


def quantizable_nodes(onnx_path: Path, op_types: Sequence[str] = QUANTIZED_OPS) -> list[str]:
    """Names of the nodes of a graph INT8 quantizes (``op_types``), in graph order."""
    require("onnx", "INT8 quantization")
    model = light_model(onnx_path)
    return [n.name for n in model.graph.node if n.op_type in op_types]


def prepare(
    src: Path,
    dst: Path,
    *,
    external_data: bool = False,
    placement: Placement = ORT_CPU,
    optimized: bool = False,
    mode: str = "static",
    attention: bool | None = None,
) -> Path:
    """``src`` with the shapes the quantizer needs inferred (through the contrib ops), into ``dst``; its fused
    attention written out first (export/int8_attention.py) with ``placement.attention``, in static ``mode``
    (dynamic quantization leaves the two products float, and written out they ran 3% slower than fused),
    where it pays (``int8_attention.pays``). ``attention``: True or False decides instead.

    Where ONNX Runtime's basic optimiser must run first (the placement asks for it and ``src`` is not
    already ONNX Runtime's optimised graph, model.ort.onnx): ``quant_pre_process`` itself, which holds
    several copies of the weights (2.6 GB for ViT-B's 330 MB). Otherwise the same two inferences
    (ONNX Runtime's symbolic shape inference, then ONNX's) run on the graph without its weights
    (export/onnx.py ``without_weights``) and the weights are written back one at a time: the
    quantized graphs are the same bytes as after ``quant_pre_process`` without optimisation (tested)."""
    require("onnxruntime.quantization", "INT8 quantization")
    _refuse_old_shape_inference()
    if attention is None and not (placement.attention and mode == "static"):
        attention = False
    try:
        if placement.optimize_first and not optimized:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            with tempfile.TemporaryDirectory(prefix=".int8-attention-", dir=dst.parent) as tmp:
                if attention is not False and _writes_out(_structure(src), attention):
                    src = written_out_copy(src, Path(tmp) / src.name, external_data)
                quant_pre_process(
                    str(src), str(dst), save_as_external_data=external_data, external_data_location=f"{dst.name}.data"
                )
        else:
            _infer_without_weights(src, dst, external_data, attention=attention)
    except Exception as exc:  # noqa: BLE001 - ORT's tools raise many types
        raise ExportError(f"INT8 pre-processing of {src.name} failed: {first_line(exc)}") from exc
    return dst


def _structure(path: Path) -> Any:
    return light_model(path)


def _writes_out(model: Any, attention: bool | None) -> bool:
    """Whether ``model``'s fused attention is written out: it has one, and ``attention`` is True, or None
    and it pays (export/int8_attention.py)."""
    return has_fused_attention(model) and (attention is True or (attention is None and pays(model)))


#: The first ONNX Runtime whose symbolic shape inference reads ``Shape``'s ``start``/``end`` (opset 15): before
#: it, the shape of a ViT's ``cls_token.expand(x.shape[0], -1, -1)`` comes out as the whole input's shape, and
#: the class-token ``Concat`` fails ("list index out of range"; seen with 1.30.0, passes with 1.31.0).
SHAPE_INFERENCE_MIN_ORT = (1, 31)


def _refuse_old_shape_inference() -> None:
    import onnxruntime

    version = str(getattr(onnxruntime, "__version__", "0"))
    parts = [int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit()]
    if tuple(parts) < SHAPE_INFERENCE_MIN_ORT:
        need = ".".join(map(str, SHAPE_INFERENCE_MIN_ORT))
        raise StageUnavailableError(
            f"INT8 quantization needs onnxruntime >= {need} (this is {version}, whose shape inference misreads "
            f"the graph's Shape(start, end) nodes): pip install -U 'onnxruntime>={need}' (or onnxruntime-gpu)"
        )


def _infer_without_weights(src: Path, dst: Path, external_data: bool, *, attention: bool | None = False) -> None:
    """``quant_pre_process(skip_optimization=True)``'s inferences with its defaults, on the graph
    without its weights; the weights written back from ``src`` (external data: the data file is
    copied beside ``dst`` under its own name, so the graph's references stay inside its folder; on
    disk, streamed, not in memory). ``attention``: the fused attention written out first (as
    :func:`_writes_out` decides; the query weights it scales are the only weights it loads, one at a time)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from ..base.onnx_wire import is_weight_matrix
    from .onnx import without_weights, write_streamed

    model = onnx.load(str(src), load_external_data=False)
    if attention is not False and _writes_out(model, attention):
        write_out_attention(model, src.parent)
    for tensor in model.graph.initializer:  # what inference reads (shapes, axes, tables) loaded, not the weights
        if tensor.data_location == onnx.TensorProto.EXTERNAL and not is_weight_matrix(tensor.dims):
            load_external_data_for_tensor(tensor, str(src.parent))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    inferred = SymbolicShapeInference.infer_shapes(without_weights(model))
    if inferred is None:
        raise ExportError(f"symbolic shape inference does not support {src.name}'s opset")
    inferred = onnx.shape_inference.infer_shapes(inferred)
    add_pre_process_metadata(inferred)
    if external_data:  # copied, not linked: ONNX refuses a data file with several links (a hardlink attack)
        for location in {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}:
            if not (dst.parent / location).exists():
                shutil.copyfile(src.parent / location, dst.parent / location)
    write_streamed(inferred, dst, {t.name: t for t in model.graph.initializer})


def static_options(placement: Placement, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """``quantize_static``'s ``extra_options`` for ``placement`` (``overrides``: its TensorQuantOverrides)."""
    ops = list(placement.op_types)
    options: dict[str, Any] = {
        "WeightSymmetric": True,
        "ActivationSymmetric": placement.symmetric_activations,
        "QuantizeBias": placement.quantize_bias,
        "OpTypesToExcludeOutputQuantization": ops,
        "CalibStridedMinMax": 1,  # one chunk of images at a time (see int8_calibration.calibration_reader)
    }
    if overrides:
        options["TensorQuantOverrides"] = overrides
    return options


def _signed_attention(pre: Path, nodes: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the attention products among the quantized ``nodes``, their keys and values): those operands are
    quantized signed, symmetric INT8 (export/int8_attention.py says why)."""
    model = light_model(pre)
    products = tuple(n for n in attention_products(model) if n in set(nodes))
    return products, signed_operands(model, set(products))


def quantize_prepared(
    pre: Path,
    dst: Path,
    *,
    input_name: str,
    mode: str = "static",
    method: str = "minmax",
    calibration: np.ndarray | None = None,
    keep_float: Sequence[str] = (),
    external_data: bool = False,
    placement: Placement = ORT_CPU,
    ranges: Path | None = None,
) -> Int8Result:
    """Quantize the pre-processed graph ``pre`` into ``dst`` (atomically); ``keep_float``: nodes left in float.

    ``calibration`` (N, C, H, W) float32 is required in static mode (the only mode of a placement
    other than :data:`ORT_CPU`). ``ranges``: a file that keeps the calibrated activation ranges of
    ``pre`` (written by the first call, read by the next: see ``int8_calibration.calibration_cache``). The
    result's quantized and float nodes are read back from the graph written (export/int8_readback.py).
    ExportError when ONNX Runtime's tools fail, or quantize a node of ``keep_float``."""
    quant = require("onnxruntime.quantization", "INT8 quantization")
    if mode == "static" and (calibration is None or not len(calibration)):
        raise ConfigError("export.int8: static quantization needs calibration images (validation.images)")
    if mode != "static" and placement != ORT_CPU:
        raise ConfigError(
            f"export.int8: the {placement.name} INT8 graph is static only (calibrated activation ranges)"
        )
    if method not in _METHODS:
        raise ConfigError(f"export.int8.calibration_method {method!r}: choose one of {', '.join(_METHODS)}")
    from .precision import shape_only_nodes

    keep_float = [*keep_float, *shape_only_nodes(pre)]  # an export for several sizes: its position table
    ops = list(placement.op_types)
    nodes = [n for n in quantizable_nodes(pre, ops) if n not in set(keep_float)]
    attention, signed = _signed_attention(pre, nodes) if placement.attention and mode == "static" else ((), [])
    with tempfile.TemporaryDirectory(prefix=".int8-", dir=dst.parent) as tmp:
        out = Path(tmp) / dst.name
        common = dict(
            op_types_to_quantize=ops,
            nodes_to_exclude=list(keep_float),
            per_channel=True,
            weight_type=quant.QuantType.QInt8,
            use_external_data_format=external_data,
        )
        try:
            if mode == "dynamic":
                log.warning(DYNAMIC_CAVEAT)
                common["nodes_to_exclude"] = _dynamic_exclusions(pre, keep_float)
                quant.quantize_dynamic(str(pre), str(out), **common, extra_options={"WeightSymmetric": True})
            else:
                activations = quant.QuantType.QInt8 if placement.activations == "int8" else quant.QuantType.QUInt8
                overrides = {t: [{"quant_type": quant.QuantType.QInt8, "symmetric": True}] for t in signed}
                cache = calibration_cache(quant, ranges)
                if cache and method == "minmax" and ranges is not None and not ranges.is_file():
                    calibrate_minmax(pre, calibration, input_name, ops, ranges)
                quant.quantize_static(
                    str(pre),
                    str(out),
                    calibration_reader(calibration, input_name),
                    quant_format=quant.QuantFormat.QDQ,
                    activation_type=activations,
                    calibrate_method=getattr(quant.CalibrationMethod, _METHODS[method]),
                    extra_options=static_options(placement, overrides),
                    **common,
                    **cache,
                )
        except Exception as exc:  # noqa: BLE001 - ORT's tools raise many types
            raise ExportError(f"INT8 quantization of {pre.name} failed: {first_line(exc)}") from exc
        nodes, kept = read_quantized_nodes(out, pre, ops, keep_float)  # what the graph does, not what was asked
        extra: list[Path] = []
        data = out.with_name(out.name + ".data")
        if external_data and data.is_file():  # the graph names its data file; move the data first, the graph last
            os.replace(data, dst.with_name(data.name))
            extra.append(dst.with_name(data.name))
        with atomic_path(dst) as final_tmp:
            os.replace(out, final_tmp)
    static = mode == "static"
    return Int8Result(
        dst,
        mode,
        method if static else None,
        len(calibration) if static and calibration is not None else 0,
        nodes,
        kept,
        tuple(extra),
        placement,
        tuple(n for n in attention if n in set(nodes)),
    )


def _dynamic_exclusions(pre: Path, keep_float: Sequence[str]) -> list[str]:
    """``keep_float`` as ``quantize_dynamic`` must be told it. Before it excludes and quantizes, it rewrites
    every Gemm (alpha = beta = 1, not transposed A) as a MatMul named ``<gemm>_MatMul`` (and an Add
    ``<gemm>_Add`` for its bias): ONNX Runtime's onnxruntime/quantization/onnx_model.py
    ``replace_gemm_with_matmul``, which ``ONNXQuantizer`` runs in dynamic mode. So a Gemm kept in float
    (the classifier head) is excluded under that name too, and ends as a float MatMul and Add."""
    gemms = set(quantizable_nodes(pre, ("Gemm",)))
    return [*keep_float, *(f"{name}_MatMul" for name in keep_float if name in gemms)]


def quantize_int8(
    src: Path,
    dst: Path,
    *,
    external_data: bool = False,
    placement: Placement = ORT_CPU,
    attention: bool | None = None,
    **kwargs: Any,
) -> Int8Result:
    """Write ``dst``, the INT8 graph of the FP32 graph ``src``: :func:`prepare` (``attention``: as there),
    then :func:`quantize_prepared` (same keyword arguments). ``placement=TENSORRT`` with ``src``
    model.onnx writes the graph TensorRT builds its INT8 engine from."""
    with tempfile.TemporaryDirectory(prefix=".int8-pre-", dir=dst.parent) as tmp:
        mode = kwargs.get("mode", "static")
        pre = prepare(
            src,
            Path(tmp) / "pre.onnx",
            external_data=external_data,
            placement=placement,
            mode=mode,
            attention=attention,
        )
        return quantize_prepared(pre, dst, external_data=external_data, placement=placement, **kwargs)


__all__ = [
    "DYNAMIC_CAVEAT",
    "Int8Result",
    "ORT_CPU",
    "Placement",
    "QUANTIZED_OPS",
    "TENSORRT",
    "prepare",
    "quantizable_nodes",
    "quantize_int8",
    "quantize_prepared",
]
