"""What a static INT8 graph is calibrated on, and how its activation ranges are found: the real validation
images (never the noise rows), fed to ONNX Runtime's calibrator a chunk at a time, and the ranges kept in a
calibration cache so that every graph quantized from one pre-processed graph shares one calibration
(MinMax computed through export/probe.py, the calibrator's own result with less memory).

``quantize.py`` quantizes with them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..base._deps import require
from ..base.errors import ConfigError


def calibration_batch(batch: np.ndarray, names: Sequence[str], *, max_images: int, min_images: int) -> np.ndarray:
    """The real validation images (never the noise rows) to calibrate on: at most ``max_images``.

    ConfigError naming the keys when there are fewer than ``min_images``."""
    rows = [i for i, n in enumerate(names) if not n.startswith("noise:")][:max_images]
    if len(rows) < min_images:
        raise ConfigError(
            f"export.int8: {len(rows)} readable validation image(s) to calibrate on, "
            "export.int8.min_calibration_images "
            f"is {min_images}; point validation.images at a folder with more real images (or lower "
            f"export.int8.min_calibration_images, or set export.int8.mode: dynamic, or export.int8.enabled: false)"
        )
    return np.ascontiguousarray(batch[rows], dtype=np.float32)


def calibration_reader(batch: np.ndarray, input_name: str, chunk: int = 1) -> Any:
    """The calibration images in chunks of ``chunk``; ``set_range`` (ONNX Runtime's strided calibration,
    ``CalibStridedMinMax``) narrows it to some of the chunks, so that each chunk is calibrated and its
    ranges merged on its own: ONNX Runtime keeps every calibrated activation of what one
    ``collect_data`` call reads (the int8 stage on ViT-B/16 with 32 images peaked at 3.3 GB with all
    of them at once, 1.6 GB one image at a time, in the same time). The ranges are the same (tested)."""
    quant = require("onnxruntime.quantization", "INT8 calibration")

    class _Reader(quant.CalibrationDataReader):
        def __init__(self) -> None:
            self._chunks = [{input_name: batch[i : i + chunk]} for i in range(0, len(batch), chunk)]
            self._it = iter(self._chunks)

        def __len__(self) -> int:
            return len(self._chunks)

        def set_range(self, start_index: int, end_index: int) -> None:
            self._it = iter(self._chunks[start_index:end_index])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    return _Reader()


def calibration_cache(quant: Any, ranges: Path | None) -> dict[str, Any]:
    """``quantize_static``'s calibration cache (ONNX Runtime >= 1.32), where asked and supported.

    The ranges calibrated on a graph are those of its float tensors, whatever nodes a quantization
    then leaves in float, so the autopilot's steps (and the speed check before them) on the same
    pre-processed graph share one calibration instead of running it again at every step: the
    calibration run (every activation of the calibrated ops as an output) is the stage's costliest
    part in time and memory. The graphs written are the same bytes either way (tested)."""
    if ranges is None:
        return {}
    import inspect

    if "calibration_cache_path" not in inspect.signature(quant.quantize_static).parameters:
        return {}  # an older ONNX Runtime calibrates at every call
    return {"calibration_cache_path": str(ranges)}


def calibrate_minmax(
    pre: Path, calibration: np.ndarray, input_name: str, op_types: Sequence[str], ranges: Path
) -> None:
    """ONNX Runtime's MinMax calibration of ``pre``, written as ``quantize_static``'s calibration cache
    ``ranges``: its calibrator's tensors (every float input and output of a node of ``op_types`` that is
    not a weight), each one's smallest and largest value over the images, a run of them at a time
    (export/probe.py's ``BATCH``: its ``ReduceMin``/``ReduceMax`` per run, merged by min and max), reduced
    through export/probe.py instead of ONNX Runtime's calibrator, which holds several copies of the model
    (1.6 GB for ViT-B/16's 330 MB). The cache, and so every graph quantized from it, is the same as the
    calibrator's (tested)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData, save_tensors_data

    from ..base.onnx_wire import in_place_model
    from .probe import BATCH, float_values, reduce_values

    model = in_place_model(pre)  # its weights read by ONNX Runtime where they lie in pre: not parsed, not copied
    floats, weights = float_values(model), {t.name for t in model.graph.initializer}
    tensors = {
        name
        for node in model.graph.node
        if node.op_type in op_types
        for name in (*node.input, *node.output)
        if name in floats and name not in weights
    }
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    wanted = {name: ("min", "max") for name in tensors}
    # prepacked, as the calibrator runs
    for run in reduce_values(pre, calibration, input_name, wanted, batch=BATCH, model=model, prepack=True):
        for name, stat in run.items():
            low[name] = min(low.get(name, stat["min"]), stat["min"])
            high[name] = max(high.get(name, stat["max"]), stat["max"])
    data = {n: (np.array([low[n]], np.float32), np.array([high[n]], np.float32)) for n in sorted(tensors)}
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), ranges)


__all__ = ["calibrate_minmax", "calibration_batch", "calibration_cache", "calibration_reader"]
