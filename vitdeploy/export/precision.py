"""Stage: the FP16 graph TensorRT compiles (``model.fp16.onnx``).

Mixed precision with float32 inputs and outputs, through onnxconverter-common's maintained
float16 converter. Kept in float32:
- every op type in ``keep_fp32_ops`` (LayerNormalization by default: its variance overflows);
- every node whose output, on the calibration batch, exceeds ``max_abs_activation`` in
  magnitude (FP16's largest finite value is 65504; the default margin leaves room for inputs
  hotter than the calibration set);
- every node of ``keep_fp32_nodes``: what the FP16 autopilot (export/autopilot.py) returned to
  float32 to meet validation.fp16.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._deps import require
from .._files import atomic_path
from ..errors import ExportError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fp16Result:
    path: Path
    kept_op_types: tuple[str, ...]
    kept_hot_nodes: tuple[str, ...]  # nodes kept float32 because their activations ran hot
    activation_peaks: dict[str, float] = field(default_factory=dict)  # hottest few node outputs
    keep_float: tuple[str, ...] = ()  # every node name asked to stay float32 (floor and autopilot)

    def summary(self) -> dict[str, Any]:
        return {
            "kept_fp32_op_types": list(self.kept_op_types),
            "kept_fp32_hot_nodes": list(self.kept_hot_nodes),
            "activation_peaks": self.activation_peaks,
            "keep_float": list(self.keep_float),
        }


def hot_nodes(peaks: dict[str, float], max_abs_activation: float) -> list[str]:
    """The nodes whose outputs exceed ``max_abs_activation`` (or are not finite), sorted."""
    return sorted(node for node, peak in peaks.items() if not np.isfinite(peak) or peak > max_abs_activation)


def activation_peaks(onnx_path: Path, calibration: np.ndarray, input_name: str) -> dict[str, float]:
    """Max |value| of every float node output over ``calibration``, by producing node name."""
    onnx = require("onnx", "FP16 calibration")
    ort = require("onnxruntime", "FP16 calibration")
    model = onnx.load(str(onnx_path))
    graph_outputs = {o.name for o in model.graph.output}
    producers: dict[str, str] = {}
    inferred = onnx.shape_inference.infer_shapes(model)
    float_values = {
        v.name for v in list(inferred.graph.value_info) + list(inferred.graph.output)
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    for node in model.graph.node:
        for out in node.output:
            if out in float_values:
                producers[out] = node.name
                if out not in graph_outputs:
                    model.graph.output.add().name = out
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # see every node
    peaks: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix=".fp16-probe-", dir=onnx_path.parent) as tmp:
        probe = Path(tmp) / "probe.onnx"  # a file, with external data: works past protobuf's 2 GB
        onnx.save_model(model, str(probe), save_as_external_data=True, location="probe.data", size_threshold=1 << 20)
        try:
            session = ort.InferenceSession(str(probe), opts, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            for start in range(0, len(calibration), 8):
                values = session.run(names, {input_name: calibration[start : start + 8]})
                for name, value in zip(names, values):
                    if name in producers and value.size:
                        finite = np.all(np.isfinite(value))
                        peak = float(np.max(np.abs(value))) if finite else float("inf")  # NaN/inf: always hot
                        node = producers[name]
                        peaks[node] = max(peaks.get(node, 0.0), peak)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types
            raise ExportError(f"FP16 calibration of {onnx_path.name} failed in ONNX Runtime: {exc}") from exc
    return peaks


def convert_fp16(
    onnx_path: Path,
    out_path: Path,
    *,
    calibration: np.ndarray,
    input_name: str = "pixel_values",
    keep_fp32_ops: Sequence[str] = ("LayerNormalization",),
    max_abs_activation: float = 4096.0,
    keep_fp32_nodes: Sequence[str] = (),
    peaks: dict[str, float] | None = None,
) -> Fp16Result:
    """Write the mixed-precision graph of ``onnx_path`` to ``out_path`` atomically.

    ``peaks``: :func:`activation_peaks` of ``onnx_path`` on ``calibration`` when already known."""
    onnx = require("onnx", "FP16 conversion")
    float16 = require("onnxconverter_common.float16", "FP16 conversion")
    if peaks is None:
        peaks = activation_peaks(onnx_path, calibration, input_name)
    hot = hot_nodes(peaks, max_abs_activation)
    blocked = sorted(set(hot) | set(keep_fp32_nodes))
    if hot:
        log.info("keeping %d hot nodes in float32 (|activation| > %g): %s", len(hot), max_abs_activation, ", ".join(hot[:10]))
    model = onnx.load(str(onnx_path))
    try:
        with warnings.catch_warnings(record=True) as clamped:  # one warning per tiny weight clamped to FP16
            warnings.simplefilter("always", UserWarning)
            converted = float16.convert_float_to_float16(
                model,
                keep_io_types=True,
                op_block_list=list(keep_fp32_ops),
                node_block_list=blocked,
                max_finite_val=65504.0,
            )
        if clamped:
            log.info("FP16 conversion clamped %d float32 constants to FP16's range", len(clamped))
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"FP16 conversion of {onnx_path.name} failed: {type(exc).__name__}: {exc}") from exc
    with atomic_path(out_path) as tmp:
        onnx.save_model(converted, str(tmp))
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except Exception as exc:  # noqa: BLE001
            raise ExportError(f"FP16 graph {out_path.name} fails onnx.checker: {exc}") from exc
    top = dict(sorted(peaks.items(), key=lambda kv: -kv[1])[:5])
    kept = tuple(n.name for n in model.graph.node if n.op_type in set(keep_fp32_ops) or n.name in set(blocked))
    return Fp16Result(out_path, tuple(keep_fp32_ops), tuple(hot), {k: round(v, 3) for k, v in top.items()}, kept)
