"""The export's reduced-precision graph rows: model.fp16.onnx, model.int8.onnx (ONNX Runtime on the
CPU) and model.int8.trt.onnx (TensorRT), each chosen by the precision autopilot where asked and
validated with ONNX Runtime on the CPU. Rows of the table in export/pipeline.py.

model.int8.onnx ships only after its ``speed-int8`` stage: it must run ``export.int8.min_speedup``
times as fast as the graph it was quantized from. An INT8 graph is optional unless its switch is
true: a failure is recorded on its stage and the export goes on without it; with the switch true it is
a refusal (export/pipeline.py): the export still goes on, then exits 3 (gate) or 4 (does not pay).
An FP16 graph that misses validation.fp16 is refused the same way (exit 3).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..base.errors import BackendError, ConfigError, ExportError, StageUnavailableError, ValidationError
from ..base.vocab import ORT_FP16, ORT_INT8
from ..runtime.backends import first_line
from .context import CPU, ExportContext, StageRecord, keep_ort, open_ort
from .engine_stages import engine_timer
from .onnx import INPUT_NAME
from .quantize import ORT_CPU, TENSORRT, Placement
from .rows import Artifact, Made, Stage, ort_gate

log = logging.getLogger(__name__)


class _Judge:
    """An autopilot's judge: each candidate graph against eager PyTorch at the largest validation batch,
    the logits of each that passes kept for the graph as written (the validation of the one that ships
    reuses them; keyed by the file itself, which the INT8 autopilot moves into place unchanged).

    Steps differ by a few nodes, and the inputs a step failed on tend to fail the next one too: a step
    first runs those inputs alone (batch 1); when they already prove the gate missed
    whatever the other inputs give (compare.proven_failure), the step fails on them, at the cost of a
    few inputs instead of all. Otherwise (or when nothing failed before) every input runs: a step that
    passes is always judged on all of them."""

    def __init__(self, ctx: ExportContext, label: str, tolerance: Any, rec: StageRecord, config: tuple = ()) -> None:
        self.ctx, self.label, self.tolerance, self.rec = ctx, label, tolerance.model_dump(), rec
        self.config = config  # the session settings of the backend that runs the graph (ort-int8's)
        self.witnesses: list[int] = []
        self.steps = 0

    def _say(self, text: str) -> None:  # the stage's running line (its heartbeat shows it): how far it is
        self.rec.progress = f"autopilot step {self.steps}: {text}"

    def _proof(self, backend: Any) -> Any:
        """The inputs the step before failed on, run alone: their proof that this graph misses the gate, or
        None (nothing failed before, or they prove nothing)."""
        from .compare import proven_failure
        from .validate import run_outputs_in_batches

        ctx, rows = self.ctx, self.witnesses
        if not rows:
            return None
        with_patches = ctx.patch_reference is not None
        self._say(f"judging the {len(rows)} input(s) the step before failed on")
        alone, alone_p = run_outputs_in_batches(backend, ctx.inputs.batch[rows], 1, None, with_patches)
        pair = (ctx.patch_reference[rows], alone_p) if with_patches else None
        return proven_failure(ctx.reference[rows], alone, len(ctx.reference), self.tolerance, ctx.kind, pair)

    def disproves(self, path: Path) -> Any:
        """Only the inputs the step before failed on: their proof that ``path`` misses the gate, or None (no
        verdict: they prove nothing). The INT8 autopilot's first look at the largest step the speed allows."""
        self.steps += 1
        if not self.witnesses:
            return None
        backend = open_ort(self.ctx, path, self.label, self.config)
        try:
            return self._proof(backend)
        finally:
            backend.close()

    def __call__(self, path: Path) -> Any:
        from .compare import compare, failing_rows

        ctx = self.ctx
        with_patches = ctx.patch_reference is not None
        self.steps += 1
        backend, keep = open_ort(ctx, path, self.label, self.config), False
        try:
            proof = self._proof(backend)
            if proof is not None:
                return proof
            logits, patches, proof = self._every_input(backend, with_patches, stop=self.steps > 1)
            if proof is not None:
                return proof
            pair = (ctx.patch_reference, patches) if with_patches else None
            verdict = compare(ctx.reference, logits, self.tolerance, ctx.kind, pair)
            if verdict.passed:  # a graph that may ship (the INT8 autopilot may judge two before shipping one)
                ctx.judged[ctx.file_identity(path)] = (logits, patches)
                keep = True  # its validation runs it next: in this session
            else:  # a pass leaves them: the next candidate may have fewer nodes in float than the one that passed
                self.witnesses = failing_rows(ctx.reference, logits, self.tolerance, kind=ctx.kind, patches=pair)
            return verdict
        finally:
            if keep:
                keep_ort(ctx, path, backend)
            else:
                backend.close()

    def _every_input(self, backend: Any, with_patches: bool, stop: bool) -> tuple[Any, Any, Any]:
        """(outputs, patch tokens, None) of every input at the largest validation batch; with ``stop``, as soon
        as the batches run so far prove the gate missed whatever the others give (compare.proven_failure),
        (None, None, that proof), the inputs that failed among them the next step's witnesses: a failing step
        stops at its first decisive batch (the verdict a run of every input gives: a failure). The first step
        is judged on every input (its metrics are every input's: what the manifest compares the others with)."""
        from .compare import failing_rows, proven_failure
        from .validate import run_outputs_in_batches

        ctx, total, size = self.ctx, len(self.ctx.reference), max(self.ctx.sizes)
        firsts, seconds = [], []
        for start in range(0, total, size):
            rows = ctx.inputs.batch[start : start + size]
            first, second = run_outputs_in_batches(backend, rows, size, None, with_patches)
            firsts.append(first)
            seconds.append(second)
            done = start + len(first)
            self._say(f"{done} of {total} inputs judged")
            if done >= total or not stop:
                continue
            logits, patches = np.concatenate(firsts), np.concatenate(seconds) if with_patches else None
            pair = (ctx.patch_reference[:done], patches) if with_patches else None
            proof = proven_failure(ctx.reference[:done], logits, total, self.tolerance, ctx.kind, pair)
            if proof is not None:
                reference = ctx.reference[:done]
                self.witnesses = failing_rows(reference, logits, self.tolerance, kind=ctx.kind, patches=pair)
                return None, None, proof
        return np.concatenate(firsts), np.concatenate(seconds) if with_patches else None, None


# -- FP16 ---------------------------------------------------------------------------------------


def _fp16(ctx: ExportContext, rec: StageRecord) -> Made:
    """model.fp16.onnx (export/precision.py); with ``export.fp16.autopilot`` the keep-float list is
    chosen by export/autopilot.py, starting from everything FP16 but the floor."""
    from .precision import convert_fp16

    section, path, gate = ctx.cfg.export.fp16, ctx.path("onnx-fp16"), ctx.cfg.validation.fp16
    onnx_path = ctx.path("onnx")
    args = dict(
        calibration=ctx.inputs.batch,
        input_name=INPUT_NAME,
        keep_fp32_ops=section.keep_fp32_ops,
        max_abs_activation=section.max_abs_activation,
        external_data_threshold_mb=ctx.cfg.export.external_data_threshold_mb,
    )
    steps: tuple = ()
    if section.autopilot:
        from .autopilot import GateError, run_fp16_autopilot

        try:
            pilot = run_fp16_autopilot(
                onnx_path, path, judge=_Judge(ctx, ORT_FP16, gate, rec), depth=ctx.loaded.config.depth, **args
            )
        except GateError as exc:  # the table goes into export-report.json
            ctx.validation["validate-fp16"] = {
                "passed": False,
                "failures": list(exc.steps[-1].failures),
                "autopilot": [s.to_dict() for s in exc.steps],
            }
            raise
        res, steps = pilot.result, pilot.steps
    else:
        res = convert_fp16(onnx_path, path, **args)
    ctx.extra["fp16"] = {**res.summary(), **({"autopilot": [s.to_dict() for s in steps]} if steps else {})}
    rec.reason = f"{len(res.kept_hot_nodes)} hot node(s) kept float32" + (
        f"; autopilot: {steps[-1].name} ({len(steps)} step(s), {len(res.keep_float)} node(s) float32)" if steps else ""
    )
    data = path.with_name(f"{path.name}.data")  # weights past export.external_data_threshold_mb (ViT-g: 2.1 GB)
    return (Artifact("onnx-fp16", path, (data,) if data.is_file() else ()),)


FP16 = Stage(
    "fp16",
    _fp16,
    roles=("onnx-fp16",),
    gate=ort_gate("validate-fp16", "fp16", ORT_FP16),
    skip=lambda ctx: None if ctx.cfg.export.fp16.enabled else "export.fp16.enabled is false",
    # missed validation.fp16 (after the autopilot): the rest ships, exit 3; no memory for it: exit 4
    refused_on=(ValidationError, StageUnavailableError),
    refusal_hint="export.fp16.enabled: false exports without it",
)


# -- INT8 ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Int8Target:
    """One INT8 graph the export writes (model.int8.onnx for ONNX Runtime, model.int8.trt.onnx for TensorRT)."""

    stage: str  # the stage's name; its validation is "validate-<stage>"
    role: str  # the manifest artifact role
    record: str  # its key under the manifest's "export"
    placement: Placement  # which ops, how quantized, for which runtime
    switch: str  # the pipeline.yaml key that turns it on
    label: str  # how the ONNX Runtime run that judges it is named in reports
    source: Callable[[ExportContext], Path]  # the FP32 graph quantized
    mode: Callable[[ExportContext], str]  # "static" | "dynamic"
    # how its graphs are timed against what they must beat (int8_speed.Timer; None: not here): the
    # fully quantized graph first, before any accuracy work (speed first)
    timer: Callable[[ExportContext, Any], Any] | None = None
    timed: bool = False  # the graph itself ships only at export.int8.min_speedup (its speed-<stage>)


def _quantize(ctx: ExportContext, rec: StageRecord, target: _Int8Target) -> Made:
    """One INT8 graph: quantize the target's source (the autopilot when ``export.int8.autopilot``).

    A timed target is timed first (int8_speed.SpeedGuard): when the fully quantized graph does not
    pay on this CPU, the stage stops before any accuracy work (skipped when the graph is optional; a
    refusal, exit 4, when it is required)."""
    from . import quantize

    section, out, src, mode = ctx.cfg.export.int8, ctx.out_dir, target.source(ctx), target.mode(ctx)
    path, placement = ctx.path(target.role), target.placement
    external = bool(ctx.entries[ctx.role_of(src)].get("external_data"))
    record = ctx.extra[target.record] = {"source": src.name, "mode": mode, "passed": False}
    with tempfile.TemporaryDirectory(prefix=".int8-pre-", dir=out) as tmp:
        calib = _calibration(ctx) if mode == "static" else None
        optimized = ctx.role_of(src) == "onnx-ort"  # already ONNX Runtime's optimised graph
        pre = quantize.prepare(
            src, Path(tmp) / "pre.onnx", external_data=external, placement=placement, optimized=optimized, mode=mode
        )
        kwargs = dict(
            input_name=INPUT_NAME,
            mode=mode,
            method=section.calibration_method,
            calibration=calib,
            external_data=external,
            placement=placement,
            ranges=Path(tmp) / "ranges.json" if mode == "static" else None,  # calibrated once for every step
        )
        speed = _speed_guard(ctx, target, pre) if section.min_speedup > 0 else None
        try:
            res, steps = _quantized(ctx, rec, target, pre, path, record, speed, kwargs)
        except StageUnavailableError as exc:  # does not pay: the timing is the verdict
            if speed is not None and speed.full is not None:
                record["speed"] = speed.full.to_dict()
            if _int8_required(target)(ctx):
                raise
            path.unlink(missing_ok=True)
            rec.status, rec.reason, record["shipped"] = "skipped", f"{path.name} not written: {first_line(exc)}", False
            log.info("%s", rec.reason)
            return ()
        finally:  # the first timing, whatever the autopilot's outcome (the manifest and the report keep it)
            if speed is not None and speed.full is not None:
                record["speed_first"] = speed.full.to_dict()
        record.update(res.summary())
        ops = "/".join(placement.op_types)
        if not res.quantized_nodes:
            log.warning(
                "%s passes validation.int8 only with every %s in float: it runs at FP32 speed (loosen "
                "validation.int8, or set %s: false)",
                path.name,
                ops,
                target.switch,
            )
        rec.reason = (
            f"{len(res.quantized_nodes)} {ops} INT8, {len(res.keep_float)} float"
            + (f" (autopilot, {len(steps)} step(s))" if steps else "")
            + f", {mode}"
            + (f", {res.method} on {res.calibration_images} images" if res.method else f"; {quantize.DYNAMIC_CAVEAT}")
        )
    return (Artifact(target.role, path, tuple(res.external_data)),)


def _quantized(
    ctx: ExportContext,
    rec: StageRecord,
    target: _Int8Target,
    pre: Path,
    path: Path,
    record: dict,
    speed: Any,
    kwargs: dict,
) -> tuple[Any, tuple]:
    """(the quantization result, the autopilot's steps): the autopilot, or one fully quantized graph."""
    from . import quantize

    if not ctx.cfg.export.int8.autopilot:
        res = quantize.quantize_prepared(pre, path, **kwargs)
        if speed is not None:
            speed.check_full(path)
        return res, ()
    from .autopilot import GateError
    from .int8_autopilot import run_autopilot

    try:
        judge = _Judge(ctx, target.label, ctx.cfg.validation.int8, rec, target.placement.session_config)
        pilot = run_autopilot(
            pre,
            path,
            judge=judge,
            quick=judge.disproves,
            depth=ctx.loaded.config.depth,
            stage=f"validate-{target.stage}",
            speed=speed,
            **kwargs,
        )
    except GateError as exc:
        record["autopilot"] = [s.to_dict() for s in exc.steps]
        raise
    record["autopilot"] = [s.to_dict() for s in pilot.steps]
    shipped = ctx.file_identity(path)  # another graph that passed (a larger one judged first) is not kept
    ctx.judged = {key: value for key, value in ctx.judged.items() if key == shipped}
    return pilot.result, pilot.steps


def _cpu_timer(ctx: ExportContext, target: _Int8Target) -> Any:
    """model.int8.onnx against the graph it was quantized from, in ONNX Runtime on this CPU."""
    from ..base.machine import describe_cpu
    from .int8_speed import Timer

    return Timer(lambda path: _speed_of(ctx, target, path), target.source(ctx).name, "CPU", describe_cpu())


def _speed_of(ctx: ExportContext, target: _Int8Target, path: Path) -> Any:
    """An INT8 graph timed against its source on the calibration batch (int8_speed.time_against)."""
    from ..runtime.backends.ort import OrtBackend
    from .int8_speed import time_against

    src = target.source(ctx)
    rows = _calibration(ctx) if target.mode(ctx) == "static" else ctx.inputs.batch
    batch = np.ascontiguousarray(rows[: max(1, min(len(rows), ctx.cfg.export.batch.opt))], dtype=np.float32)
    config = target.placement.session_config  # as the backend that runs it will (ort-int8)
    int8 = OrtBackend(path, ctx.chw, None, CPU, name=target.label, session_config=config)
    base = OrtBackend(src, ctx.chw, None, CPU)
    try:
        return time_against(int8, base, batch, ctx.cfg.export.int8.min_speedup)
    finally:
        keep_ort(ctx, path, int8)  # the autopilot judges the graph timed next: in this session
        base.close()


def _speed_guard(ctx: ExportContext, target: _Int8Target, pre: Path) -> Any:
    """Speed first for ``target`` (int8_speed.SpeedGuard): what the autopilot's steps cost, how to time
    one; None when the target is not timed here (no timer, or nothing to time it against)."""
    from ..base.onnx_wire import light_model
    from .int8_speed import SpeedGuard, multiply_adds

    timer = target.timer(ctx, target) if target.timer else None
    if timer is None:
        return None
    model = light_model(pre)
    return SpeedGuard(
        timer=timer,
        costs=multiply_adds(model, target.placement.op_types),
        min_speedup=ctx.cfg.export.int8.min_speedup,
        refuse=StageUnavailableError,
    )


def _calibration(ctx: ExportContext) -> np.ndarray:
    """The real validation images static INT8 calibrates on (ConfigError when too few)."""
    from .int8_calibration import calibration_batch

    section = ctx.cfg.export.int8
    return calibration_batch(
        ctx.inputs.batch,
        ctx.inputs.names,
        max_images=section.calibration_images,
        min_images=section.min_calibration_images,
    )


def _validated(target: _Int8Target) -> Callable[[ExportContext, Made], bool]:
    def ships(ctx: ExportContext, made: Made) -> bool:
        ctx.extra[target.record]["passed"] = True
        return True

    return ships


def _worth_running(target: _Int8Target) -> Callable[[ExportContext, Made], bool]:
    """After validation: time the INT8 graph against its source (the ``speed-<stage>`` stage,
    int8_speed.speed_verdict); below ``export.int8.min_speedup`` the graph is not shipped (required:
    StageUnavailableError, exit 4). The fully quantized graph was timed already (speed first): that
    measurement stands for it."""

    def ships(ctx: ExportContext, made: Made) -> bool:
        from .int8_speed import speed_verdict

        record = ctx.extra[target.record]
        record["passed"] = True
        timer = target.timer(ctx, target) if target.timer else None
        required = _int8_required(target)(ctx)
        stage = f"speed-{target.stage}"
        return speed_verdict(ctx, stage, made[0].path, record, timer, required, StageUnavailableError)

    return ships


def _int8_required(target: _Int8Target) -> Callable[[ExportContext], bool]:
    section = "enabled" if target.role == "onnx-int8" else "tensorrt"
    return lambda ctx: getattr(ctx.cfg.export.int8, section) is True


def _int8_row(target: _Int8Target, skip: Callable[[ExportContext], str | None]) -> Stage:
    """An INT8 graph's row. A failure (too few calibration images, the tools failing, validation.int8
    not met, too slow) is fatal when its switch is true; otherwise the export goes on without it."""

    def dropped(ctx: ExportContext, exc: BaseException) -> None:
        log.warning(
            "%s not written (%s: auto; the export goes on without it): %s",
            ctx.path(target.role).name,
            target.switch,
            first_line(exc),
        )

    return Stage(
        target.stage,
        lambda ctx, rec: _quantize(ctx, rec, target),
        skip=skip,
        roles=(target.role,),
        gate=ort_gate(f"validate-{target.stage}", "int8", target.label, target.placement.session_config),
        ships=(_worth_running if target.timed else _validated)(target),
        fallible=(ConfigError, ExportError, BackendError, ValidationError),
        required=_int8_required(target),
        dropped=dropped,
        refusal_hint=f"{target.switch}: auto exports without it",
    )


def _skip_int8_tensorrt(ctx: ExportContext) -> str | None:
    switch = ctx.cfg.export.int8.tensorrt
    if switch is False:
        return "export.int8.tensorrt is false"
    if switch == "auto" and ctx.tensorrt_unavailable():
        return f"export.int8.tensorrt is auto and no engine is built here: {ctx.tensorrt_unavailable()}"
    return None


#: model.int8.onnx from the fused graph (model.onnx without it), for ONNX Runtime on the CPU
INT8 = _int8_row(
    _Int8Target(
        "int8",
        "onnx-int8",
        "int8",
        ORT_CPU,
        "export.int8.enabled",
        ORT_INT8,
        source=lambda ctx: ctx.artifacts.get("onnx-ort", ctx.artifacts["onnx"]),
        mode=lambda ctx: ctx.cfg.export.int8.mode,
        timer=_cpu_timer,
        timed=True,
    ),
    skip=lambda ctx: "export.int8.enabled is false" if ctx.cfg.export.int8.enabled is False else None,
)
#: model.int8.trt.onnx (placement TENSORRT) from the plain graph: the graph the INT8 TensorRT engine is
#: built from, judged here by ONNX Runtime on the CPU
INT8_TENSORRT = _int8_row(
    _Int8Target(
        "int8-trt",
        "onnx-int8-trt",
        "int8_tensorrt",
        TENSORRT,
        "export.int8.tensorrt",
        "ort (model.int8.trt.onnx)",
        source=lambda ctx: ctx.artifacts["onnx"],
        mode=lambda ctx: "static",
        timer=engine_timer,  # against the FP16 engine, when one was built here (its engine is timed again)
    ),
    skip=_skip_int8_tensorrt,
)
