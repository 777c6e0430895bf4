"""One TensorRT engine build's settings, checked before TensorRT is touched: the ONNX graph and the engine
written, the input and its optimisation profile (batch sizes, and the image sizes of an export for several),
the builder's workspace and level, the timing cache, the GPU. ``tensorrt.py`` builds what a plan says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError
from ..runtime.cuda import cuda_index

_MIB = 1024 * 1024
_PRECISIONS = ("fp16", "fp32", "int8")  # int8: a Q/DQ graph (explicit quantization), float parts in FP32


@dataclass(frozen=True)
class EngineBuildPlan:
    """Everything one engine build needs, validated by :func:`plan_engine_build`."""

    onnx_path: Path
    engine_path: Path
    input_name: str
    chw: tuple[int, int, int]
    min_batch: int
    opt_batch: int
    max_batch: int
    workspace_bytes: int
    optimization_level: int  # builder_optimization_level, 0 (fast build) .. 5 (slowest, best)
    timing_cache_path: Path | None  # reused and updated across builds; None = no persistent cache
    precision: str = "fp16"  # the precision of the ONNX graph at onnx_path, recorded in the json
    device: int = 0  # the CUDA device the engine is built on, probed and recorded (runtime.device)
    image_sizes: tuple[int, ...] = ()  # an export for several sizes: the profile spans them (chw's side: opt)

    @property
    def meta_path(self) -> Path:
        """model.engine.json beside model.engine."""
        return self.engine_path.with_name(self.engine_path.name + ".json")

    @property
    def workspace_mb(self) -> int:
        return self.workspace_bytes // _MIB

    def profile_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(min, opt, max) input shapes (N, C, H, W) of the optimisation profile."""
        c, h, w = self.chw
        sides = self.image_sizes
        low, high = ((min(sides),) * 2, (max(sides),) * 2) if sides else ((h, w), (h, w))
        return ((self.min_batch, c, *low), (self.opt_batch, c, h, w), (self.max_batch, c, *high))


def _int_setting(key: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"TensorRT build setting {key}={value!r}: expected an integer")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"TensorRT build setting {key}={value!r}: expected an integer {bound}")
    return value


def plan_engine_build(
    onnx_path: str | Path,
    engine_path: str | Path,
    *,
    input_name: str = "pixel_values",
    chw: tuple[int, int, int],
    min_batch: int = 1,
    opt_batch: int = 8,
    max_batch: int = 32,
    workspace_mb: int = 4096,
    optimization_level: int = 3,
    timing_cache_path: str | Path | None = None,
    precision: str = "fp16",
    device: str | int | None = None,
    image_sizes: tuple[int, ...] = (),
) -> EngineBuildPlan:
    """Validate the build settings; ConfigError naming the offending key otherwise."""
    for key, value in (("min_batch", min_batch), ("opt_batch", opt_batch), ("max_batch", max_batch)):
        _int_setting(key, value, 1)
    if min_batch > opt_batch:
        raise ConfigError(
            f"TensorRT build setting min_batch={min_batch} is larger than opt_batch={opt_batch}: need min_batch <= "
            "opt_batch <= max_batch"
        )
    if opt_batch > max_batch:
        raise ConfigError(
            f"TensorRT build setting opt_batch={opt_batch} is larger than max_batch={max_batch}: need min_batch <= "
            "opt_batch <= max_batch"
        )
    _int_setting("workspace_mb", workspace_mb, 1)
    _int_setting("optimization_level", optimization_level, 0, 5)
    if not isinstance(input_name, str) or not input_name:
        raise ConfigError(
            f"TensorRT build setting input_name={input_name!r}: expected a non-empty string (the ONNX input, e.g. "
            "'pixel_values')"
        )
    if not isinstance(chw, (tuple, list)) or len(chw) != 3:
        raise ConfigError(f"TensorRT build setting chw={chw!r}: expected (channels, height, width)")
    for axis, value in zip(("chw[0] (channels)", "chw[1] (height)", "chw[2] (width)"), chw):
        _int_setting(axis, value, 1)
    if precision not in _PRECISIONS:
        raise ConfigError(
            f"TensorRT build setting precision={precision!r}: expected one of {_PRECISIONS} (the ONNX graph's "
            "precision)"
        )
    return EngineBuildPlan(
        onnx_path=Path(onnx_path),
        engine_path=Path(engine_path),
        input_name=input_name,
        chw=(int(chw[0]), int(chw[1]), int(chw[2])),
        min_batch=min_batch,
        opt_batch=opt_batch,
        max_batch=max_batch,
        workspace_bytes=workspace_mb * _MIB,
        optimization_level=optimization_level,
        timing_cache_path=Path(timing_cache_path) if timing_cache_path is not None else None,
        precision=precision,
        device=cuda_index("cuda:0" if device == "cpu" else device),
        image_sizes=tuple(int(s) for s in image_sizes),
    )


__all__ = ["EngineBuildPlan", "plan_engine_build"]
