"""The export's TensorRT engine rows: model.engine from model.fp16.onnx and model.int8.engine from
model.int8.trt.onnx (export/tensorrt.py builds both), each validated on the GPU it was built on.
Rows of the table in export/pipeline.py.

``--engine require`` makes a failure of the FP16 engine a refusal (export/pipeline.py: the export is
written without it and exits non-zero, 4 when TensorRT/CUDA is missing), and of the INT8 engine too
when ``export.int8.tensorrt`` is true; otherwise a failure is recorded and the export goes on without
that engine. validation.fp16 missed by the FP16 engine is always a refusal (exit 3), as for every
FP16 artifact; the INT8 engine is optional like the INT8 graphs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..base.errors import ArtifactError, BackendError, ExportError, MissingDependencyError, ValidationError
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

    cfg, profile, device = ctx.cfg, ctx.cfg.export.batch, ctx.tensorrt_device()
    engine_path, meta_path = ctx.path(role), ctx.path(f"{role}-meta")
    plan = trt_stage.plan_engine_build(
        ctx.artifacts[source],
        engine_path,
        input_name=INPUT_NAME,
        chw=ctx.chw,
        min_batch=profile.min,
        opt_batch=profile.opt,
        max_batch=profile.max,
        workspace_mb=cfg.tensorrt.workspace_mb,
        optimization_level=cfg.tensorrt.optimization_level,
        device=device,
        precision=precision,
        timing_cache_path=cfg.resolve(cfg.tensorrt.timing_cache) or ctx.out_dir / TIMING_CACHE_NAME,
    )

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
    rec.reason = f"built on {device}"
    return (Artifact(role, engine_path), Artifact(f"{role}-meta", meta_path))


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
    refusal_hint="export.int8.tensorrt: auto exports without it",
)
