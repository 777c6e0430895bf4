"""The export's TensorRT engine rows: model.engine from model.fp16.onnx and model.int8.engine from
model.int8.trt.onnx (export/tensorrt.py builds both), each validated on the GPU it was built on.
Rows of the table in export/pipeline.py.

INT8 must beat FP16 on the GPU: the INT8 engine ships only at ``export.int8.min_speedup`` times
model.engine (its ``speed-engine-int8`` stage), and before the INT8 TensorRT graph's autopilot spends
any accuracy work, the fully quantized graph is built into a throw-away engine and timed against
model.engine (:func:`engine_timer`, used by the int8-trt row): when it does not pay, nothing more is
done for it. So model.engine is built before model.int8.trt.onnx.

``--engine require`` makes a failure of the FP16 engine a refusal (export/pipeline.py: the export is
written without it and exits non-zero, 4 when TensorRT/CUDA is missing), and of the INT8 engine too
when ``export.int8.tensorrt`` is true; otherwise a failure is recorded and the export goes on without
that engine. validation.fp16 missed by the FP16 engine is always a refusal (exit 3), as for every
FP16 artifact; the INT8 engine is optional like the INT8 graphs.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import (
    ArtifactError,
    BackendError,
    ExportError,
    MissingDependencyError,
    StageUnavailableError,
    ValidationError,
)
from ..base.vocab import TIMING_CACHE_NAME, TRT_INT8
from ..runtime.backends.base import BackendOptions
from .context import ExportContext, StageRecord
from .onnx import INPUT_NAME
from .rows import Artifact, Gate, Made, Stage

log = logging.getLogger(__name__)

_ENGINE_ERRORS = (ExportError, BackendError, ArtifactError, MissingDependencyError)


def _engine_unavailable(ctx: ExportContext) -> str | None:
    if "onnx-fp16" in ctx.artifacts:
        return ctx.tensorrt_unavailable()
    if not ctx.cfg.export.fp16.enabled:
        return "the engine is compiled from model.fp16.onnx and export.fp16.enabled is false"
    return "the engine is compiled from model.fp16.onnx, which was not written (refused above)"


def _skip_engine(ctx: ExportContext) -> str | None:
    if ctx.engine_mode == "skip":
        return "--engine skip"
    return None if ctx.engine_mode == "require" else _engine_unavailable(ctx)  # require: the stage fails instead


def _engine(ctx: ExportContext, rec: StageRecord) -> Made:
    why_not = _engine_unavailable(ctx)
    if why_not:  # only under --engine require (otherwise skipped)
        raise MissingDependencyError(f"TensorRT engine required (--engine require) but {why_not}")
    return _engine_from(ctx, rec, "engine", "onnx-fp16", "fp16")


def _engine_from(ctx: ExportContext, rec: StageRecord, role: str, source: str, precision: str) -> Made:
    """Build the engine ``role`` (stage of the same name) from the ONNX graph ``source``."""
    from . import tensorrt as trt_stage

    engine_path, meta_path = ctx.path(role), ctx.path(f"{role}-meta")
    plan = _plan(ctx, ctx.artifacts[source], engine_path, precision)
    shown = [0.0]

    def progress(text: str) -> None:  # at most one line a second
        if time.perf_counter() - shown[0] >= 1.0:
            shown[0], rec.reason = time.perf_counter(), text
            ctx.emit(rec)

    try:
        trt_stage.build_engine(plan, progress=progress)
    except BaseException:
        rec.reason = ""  # the stage records the error, not the last progress line
        raise
    rec.reason = f"built on {plan.device}"
    return (Artifact(role, engine_path), Artifact(f"{role}-meta", meta_path))


def _plan(ctx: ExportContext, graph: Path, engine_path: Path, precision: str) -> Any:
    """The build of ``graph`` into ``engine_path`` with the export's settings (export/engine_plan.py)."""
    from .engine_plan import plan_engine_build

    cfg, profile = ctx.cfg, ctx.cfg.export.batch
    return plan_engine_build(
        graph,
        engine_path,
        input_name=INPUT_NAME,
        chw=ctx.chw,
        image_sizes=ctx.image_sizes,
        min_batch=profile.min,
        opt_batch=profile.opt,
        max_batch=profile.max,
        workspace_mb=cfg.tensorrt.workspace_mb,
        optimization_level=cfg.tensorrt.optimization_level,
        device=ctx.tensorrt_device(),
        precision=precision,
        timing_cache_path=cfg.resolve(cfg.tensorrt.timing_cache) or ctx.out_dir / TIMING_CACHE_NAME,
    )


# -- INT8 against FP16 on the GPU -----------------------------------------------------------------


def _open_engine(ctx: ExportContext, engine: Path, meta: Path, name: str) -> Any:
    from ..runtime.backends.trt import TrtBackend

    gpu = BackendOptions(device=ctx.tensorrt_device())
    return TrtBackend(engine, meta, ctx.chw, ctx.cfg.export.batch.max, gpu, name=name)


def time_engines(ctx: ExportContext, engine: Path, meta: Path) -> Any:
    """The INT8 engine ``engine`` against the FP16 engine model.engine on the GPU both were built on, on
    the profile's ``opt`` validation images (int8_speed.time_against: interleaved, median)."""
    from .int8_speed import time_against

    rows = ctx.inputs.batch
    batch = np.ascontiguousarray(rows[: max(1, min(len(rows), ctx.cfg.export.batch.opt))], dtype=np.float32)
    int8 = _open_engine(ctx, engine, meta, TRT_INT8)
    try:
        fp16 = _open_engine(ctx, ctx.artifacts["engine"], ctx.artifacts["engine-meta"], "trt")
        try:
            return time_against(int8, fp16, batch, ctx.cfg.export.int8.min_speedup)
        finally:
            fp16.close()
    finally:
        int8.close()


def time_graph_as_engine(ctx: ExportContext, graph: Path) -> Any:
    """An INT8 graph (model.int8.trt.onnx, or an autopilot step of it) built into a throw-away engine
    and timed against model.engine: what the INT8 engine built from it would gain on this GPU; None
    when it does not build (the graph is then judged without a speed-first verdict)."""
    from . import tensorrt as trt_stage

    with tempfile.TemporaryDirectory(prefix=".int8-engine-", dir=ctx.out_dir) as tmp:
        plan = _plan(ctx, graph, Path(tmp) / "probe.engine", "int8")
        try:
            trt_stage.build_engine(plan)
        except _ENGINE_ERRORS as exc:  # the INT8 engine's own stage will fail the same way, and say so
            log.warning("%s not timed before its autopilot (its engine did not build): %s", graph.name, exc)
            return None
        return time_engines(ctx, plan.engine_path, plan.meta_path)


def engine_timer(ctx: ExportContext, target: Any = None) -> Any:
    """How INT8 TensorRT graphs and engines are timed (int8_speed.Timer): against the FP16 engine built
    and validated in this export; None when there is none (not built here, refused, or switched off):
    then nothing INT8 for TensorRT is timed, and the stage says so."""
    if "engine" not in ctx.artifacts:
        return None
    from ..runtime.cuda import gpu_identity
    from .int8_speed import Timer

    try:
        gpu = gpu_identity(ctx.tensorrt_device()).describe()
    except MissingDependencyError:
        gpu = ctx.tensorrt_device()
    return Timer(lambda path: time_graph_as_engine(ctx, path), "model.engine (FP16)", "GPU", gpu)


def _engine_int8_pays(ctx: ExportContext, made: Made) -> bool:
    """``speed-engine-int8``: model.int8.engine ships only at ``export.int8.min_speedup`` times the FP16
    engine (int8_speed.speed_verdict): ModelOpt's users report ViT INT8 engines no faster than FP16."""
    from .int8_speed import Timer, speed_verdict

    fp16 = engine_timer(ctx)
    timer = fp16 and Timer(lambda _path: time_engines(ctx, made[0].path, made[1].path), *_described(fp16))
    record = ctx.extra.setdefault("int8_tensorrt", {})
    required = ctx.engine_mode == "require" and ctx.cfg.export.int8.tensorrt is True
    stage, path = "speed-engine-int8", made[0].path
    return speed_verdict(ctx, stage, path, record, timer, required, StageUnavailableError, False, "engine_speed")


def _described(timer: Any) -> tuple[str, str, str]:
    return timer.baseline, timer.device, timer.machine


def _trt_gate(name: str, tolerance: str, backend: str) -> Gate:
    """The engine run by the trt backend on the GPU it was built on, at batch sizes inside its profile."""

    def open_trt(ctx: ExportContext, made: Made) -> Any:
        from ..runtime.backends.trt import TrtBackend

        gpu = BackendOptions(device=ctx.tensorrt_device())
        return TrtBackend(made[0].path, made[1].path, ctx.chw, ctx.cfg.export.batch.max, gpu, name=backend)

    def in_profile(ctx: ExportContext) -> tuple[int, ...]:
        profile = ctx.cfg.export.batch
        return tuple(sorted({min(max(b, profile.min), profile.max) for b in ctx.sizes}))

    return Gate(name, tolerance, open_trt, in_profile)


def _dropped(role: str) -> Any:
    def dropped(ctx: ExportContext, exc: BaseException) -> None:
        # the validated ONNX artifacts stay usable; the manifest records why there is no engine.
        log.warning("TensorRT %s not built (the export goes on without it): %s", ctx.path(role).name, exc)

    return dropped


ENGINE = Stage(
    "engine",
    _engine,
    skip=_skip_engine,
    roles=("engine", "engine-meta"),
    gate=_trt_gate("validate-engine", "fp16", "trt"),
    fallible=_ENGINE_ERRORS,
    required=lambda ctx: ctx.engine_mode == "require",
    dropped=_dropped("engine"),
    refusal_hint="--engine auto exports without it",
    refused_on=(ValidationError,),  # an engine that misses validation.fp16: the ONNX artifacts ship, exit 3
)
ENGINE_INT8 = Stage(
    "engine-int8",
    lambda ctx, rec: _engine_from(ctx, rec, "engine-int8", "onnx-int8-trt", "int8"),
    applies=lambda ctx: ctx.engine_mode != "skip" and "onnx-int8-trt" in ctx.artifacts,  # its graph was written
    skip=lambda ctx: ctx.tensorrt_unavailable(),
    roles=("engine-int8", "engine-int8-meta"),
    gate=_trt_gate("validate-engine-int8", "int8", TRT_INT8),
    fallible=(*_ENGINE_ERRORS, ValidationError),
    required=lambda ctx: ctx.engine_mode == "require" and ctx.cfg.export.int8.tensorrt is True,
    dropped=_dropped("engine-int8"),
    ships=_engine_int8_pays,
    refusal_hint="export.int8.tensorrt: auto exports without it",
)
