"""Build the FP16 TensorRT engine (model.engine + model.engine.json) from the FP16 ONNX graph.

Written against the TensorRT 10.x and 11.x Python API. Precision comes from the graph, never
from builder flags: TensorRT 11 removed weak typing (``BuilderFlag.FP16`` no longer exists,
every network is strongly typed), and on 10.x we ask for the same behaviour with
``NetworkDefinitionCreationFlag.STRONGLY_TYPED``. So an FP16 engine is built from
model.fp16.onnx (FP16 inside, float32 I/O) and runs exactly the types that graph declares.

``build_engine`` takes the ``tensorrt`` module as an argument (imported lazily when None) so the
build logic can be tested with a stand-in module where TensorRT cannot be installed.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .._files import atomic_path
from .._deps import require
from ..errors import ConfigError, ExportError
from ..runtime.artifacts import sha256_file
from ..runtime.backends.trt import INSTALL_HINT, EngineMetadata, make_trt_logger, recent_errors, unavailable_reason
from ..runtime.cuda import GpuIdentity, gpu_identity

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_PRECISIONS = ("fp16", "fp32")


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

    @property
    def meta_path(self) -> Path:
        """model.engine.json beside model.engine."""
        return self.engine_path.with_name(self.engine_path.name + ".json")

    @property
    def workspace_mb(self) -> int:
        return self.workspace_bytes // _MIB

    def profile_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(min, opt, max) input shapes (N, C, H, W) of the optimisation profile."""
        return tuple((batch, *self.chw) for batch in (self.min_batch, self.opt_batch, self.max_batch))  # type: ignore[return-value]


def _int_setting(key: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"TensorRT build setting {key}={value!r}: expected an integer")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"TensorRT build setting {key}={value!r}: expected an integer {bound}")
    return value


def plan_engine_build(onnx_path: str | Path, engine_path: str | Path, *, input_name: str = "pixel_values",
                      chw: tuple[int, int, int], min_batch: int = 1, opt_batch: int = 8, max_batch: int = 32,
                      workspace_mb: int = 4096, optimization_level: int = 3,
                      timing_cache_path: str | Path | None = None, precision: str = "fp16") -> EngineBuildPlan:
    """Validate the build settings; ConfigError naming the offending key otherwise."""
    for key, value in (("min_batch", min_batch), ("opt_batch", opt_batch), ("max_batch", max_batch)):
        _int_setting(key, value, 1)
    if min_batch > opt_batch:
        raise ConfigError(f"TensorRT build setting min_batch={min_batch} is larger than opt_batch={opt_batch}: need min_batch <= opt_batch <= max_batch")
    if opt_batch > max_batch:
        raise ConfigError(f"TensorRT build setting opt_batch={opt_batch} is larger than max_batch={max_batch}: need min_batch <= opt_batch <= max_batch")
    _int_setting("workspace_mb", workspace_mb, 1)
    _int_setting("optimization_level", optimization_level, 0, 5)
    if not isinstance(input_name, str) or not input_name:
        raise ConfigError(f"TensorRT build setting input_name={input_name!r}: expected a non-empty string (the ONNX input, e.g. 'pixel_values')")
    if not isinstance(chw, (tuple, list)) or len(chw) != 3:
        raise ConfigError(f"TensorRT build setting chw={chw!r}: expected (channels, height, width)")
    for axis, value in zip(("chw[0] (channels)", "chw[1] (height)", "chw[2] (width)"), chw):
        _int_setting(axis, value, 1)
    if precision not in _PRECISIONS:
        raise ConfigError(f"TensorRT build setting precision={precision!r}: expected one of {_PRECISIONS} (the ONNX graph's precision)")
    return EngineBuildPlan(
        onnx_path=Path(onnx_path), engine_path=Path(engine_path), input_name=input_name,
        chw=(int(chw[0]), int(chw[1]), int(chw[2])), min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch,
        workspace_bytes=workspace_mb * _MIB, optimization_level=optimization_level,
        timing_cache_path=Path(timing_cache_path) if timing_cache_path is not None else None, precision=precision,
    )


def tensorrt_unavailable_reason() -> str | None:
    """None when ``tensorrt`` imports and a CUDA GPU (cuda:0) is usable; else why not, in one line.

    The check itself lives with the trt backend (one implementation for export and runtime).
    """
    return unavailable_reason()


# --------------------------------------------------------------------------------------------
# helpers


def tensorrt_major(version: str) -> int:
    """10 for "10.13.3.9"; ExportError for an unparseable version."""
    head = str(version).split(".")[0]
    if not head.isdigit():
        raise ExportError(f"cannot read the TensorRT major version from tensorrt.__version__={version!r}")
    return int(head)


def _network_flags(trt: Any, major: int) -> int:
    """The ``create_network`` flags: STRONGLY_TYPED on 10.x, nothing on 11.x.

    Networks are always strongly typed (precision comes from the ONNX graph). TensorRT 11 makes
    every network strongly typed; its NetworkDefinitionCreationFlag.STRONGLY_TYPED (still in the
    11.4 bindings) is deprecated and ignored, so it is not passed there.
    """
    if major >= 11:
        return 0
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if flag is None:
        raise ExportError(f"this TensorRT ({major}.x) has no NetworkDefinitionCreationFlag.STRONGLY_TYPED: "
                          f"vitdeploy needs TensorRT >= 10.0 ({INSTALL_HINT})")
    return 1 << int(flag)


def _atomic_write(path: Path, data: Any) -> None:
    """Write bytes (or any buffer, e.g. TensorRT's IHostMemory) to ``path`` atomically."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc}") from exc


def _attach_timing_cache(config: Any, path: Path | None) -> None:
    """Load ``path`` (when it exists) into a timing cache and attach it to the builder config.

    A cache from another TensorRT version or GPU is refused by TensorRT (ignore_mismatch=False);
    the build then starts from an empty cache, which replaces the file afterwards.
    """
    if path is None:
        return
    data = b""
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as exc:
            log.warning("cannot read the TensorRT timing cache %s (%s); starting an empty one", path, exc)
    if data:
        cache = config.create_timing_cache(data)
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            log.info("TensorRT timing cache: reusing %s (%d bytes)", path, len(data))
            return
        log.warning("TensorRT timing cache %s was made by another TensorRT version or GPU; starting an empty one (the file will be replaced)", path)
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise ExportError(f"TensorRT could not create a timing cache for {path}")


def _save_timing_cache(config: Any, path: Path | None) -> None:
    if path is None:
        return
    cache = config.get_timing_cache()
    if cache is None:
        log.warning("TensorRT returned no timing cache; %s not updated", path)
        return
    _atomic_write(path, memoryview(cache.serialize()))
    log.info("TensorRT timing cache: saved %s", path)


# --------------------------------------------------------------------------------------------
# the build


def build_engine(plan: EngineBuildPlan, trt: Any = None, logger: Any = None, *,
                 device_probe: Callable[[], GpuIdentity] | None = None) -> EngineMetadata:
    """Build ``plan.engine_path`` (+ its .json) from ``plan.onnx_path``; return the metadata written.

    ``trt``: the tensorrt module (imported when None). ``logger``: a ``trt.ILogger`` (default: one
    forwarding to Python logging). ``device_probe``: returns the GPU the engine is built on
    (default: cuda:0 via torch). ExportError when parsing or building fails; no partial
    model.engine is ever left behind.
    """
    if trt is None:
        trt = require("tensorrt", "building the TensorRT engine")
    if not plan.onnx_path.is_file():
        raise ExportError(f"ONNX graph {plan.onnx_path} does not exist; export the ONNX stage first")
    version = str(trt.__version__)
    major = tensorrt_major(version)
    if major < 10:
        raise ExportError(f"TensorRT {version} is too old: vitdeploy needs TensorRT 10.x or 11.x ({INSTALL_HINT})")
    gpu = (device_probe or gpu_identity)()
    if logger is None:
        logger = make_trt_logger(trt, log)

    builder = trt.Builder(logger)
    flags = _network_flags(trt, major)
    network = builder.create_network(flags) if flags else builder.create_network()
    parser = trt.OnnxParser(network, logger)
    # parse_from_file (not parse(bytes)) so external data files beside the ONNX graph resolve.
    if not parser.parse_from_file(str(plan.onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(int(parser.num_errors))]
        listing = "\n".join(f"  {i + 1}. {text}" for i, text in enumerate(errors)) or "  (the parser reported no details)"
        raise ExportError(f"TensorRT {version} could not parse {plan.onnx_path} ({len(errors)} error(s)):\n{listing}\n"
                          "Check the graph with onnx.checker and ONNX Runtime, or use a TensorRT version that supports these operators.")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes)
    config.builder_optimization_level = plan.optimization_level
    profile = builder.create_optimization_profile()
    shape_min, shape_opt, shape_max = plan.profile_shapes()
    profile.set_shape(plan.input_name, shape_min, shape_opt, shape_max)
    if config.add_optimization_profile(profile) < 0:
        raise ExportError(f"TensorRT rejected the optimisation profile {shape_min}/{shape_opt}/{shape_max} for input "
                          f"'{plan.input_name}' of {plan.onnx_path}{recent_errors(logger)}")
    _attach_timing_cache(config, plan.timing_cache_path)

    log.info("building TensorRT %s engine from %s on %s (batch %d/%d/%d, workspace %d MiB, level %d)", version,
             plan.onnx_path, gpu.describe(), plan.min_batch, plan.opt_batch, plan.max_batch, plan.workspace_mb, plan.optimization_level)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT {version} failed to build an engine from {plan.onnx_path} on {gpu.describe()}"
                          f"{recent_errors(logger)}; check that input '{plan.input_name}' exists with shape (batch, "
                          f"{', '.join(map(str, plan.chw))}) and try a larger workspace_mb (now {plan.workspace_mb})")
    # The json goes first and comes back last, so a new engine never sits beside an old json
    # (the backend refuses an engine without its json: "rebuild").
    with contextlib.suppress(FileNotFoundError):
        plan.meta_path.unlink()
    _atomic_write(plan.engine_path, memoryview(serialized))
    _save_timing_cache(config, plan.timing_cache_path)

    precision_text = f"{plan.precision} (strongly typed from the {plan.precision.upper()} ONNX graph)"
    meta = EngineMetadata(
        tensorrt_version=version, gpu_name=gpu.name, compute_capability=gpu.compute_capability,
        profile={"min": plan.min_batch, "opt": plan.opt_batch, "max": plan.max_batch}, input=plan.input_name,
        chw=plan.chw, precision=precision_text, onnx_sha256=sha256_file(plan.onnx_path), workspace_mb=plan.workspace_mb,
        optimization_level=plan.optimization_level, built=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    _atomic_write(plan.meta_path, (json.dumps(meta.to_dict(), indent=2) + "\n").encode("utf-8"))
    log.info("wrote %s and %s", plan.engine_path, plan.meta_path)
    return meta
