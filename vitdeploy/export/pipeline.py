"""`vitdeploy export`: the stage table and the one loop that runs it.

Each row of :data:`STAGES` (export/rows.py says what a row is) names a stage, why it would be
skipped, what it runs and returns (its artifacts) and the ``validation.*`` gate they must meet.
:func:`run_stages` does the rest for every row: timing and progress (``on_stage``), the validation
against the eager PyTorch reference, the ``*.rejected`` rename of an artifact that drifts, the
manifest entries, and going on without an optional artifact that failed. Adding a precision is
adding a row.

A manifest is the only mark of a valid export: it is written only when every stage that ran has
passed or was refused. A refused stage is one asked for explicitly (``export.int8.enabled: true``,
``--engine require``, an FP16 graph that misses ``validation.fp16``) that could not be met: the
export goes on without its artifact, the manifest (``export.refused``) and ``export-report.json``
say why, and :func:`run_export` raises RefusedStagesError (exit 3 or 4, naming the key) after the
export was written, so the validated artifacts are never lost with it. Every stage writes into a
staging folder beside the output folder, swapped in when the export succeeds (export/staging.py), so
the output folder always holds one complete export, the previous or the new one, even after
``kill -9``. An artifact that fails validation is renamed ``<name>.rejected`` so nothing loads it as valid;
its report is ``export-report.json`` (both are moved into the output folder, beside the previous
export).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..base import memory
from ..base.config import PipelineConfig
from ..base.errors import ExportError, RefusedStagesError, ValidationError, WriteError
from ..base.vocab import ARTIFACT_FILES, EXPORT_REPORT_NAME, MANIFEST_NAME, SIGNATURE_NAME, TIMING_CACHE_NAME
from ..runtime.manifest_schema import Manifest, parse_manifest, read_json_bounded
from . import memory_budget
from .bf16_stage import BF16
from .context import EngineMode, ExportContext, StageCallback, StageRecord
from .core_stages import MANIFEST, MODEL, ONNX, ORT_OPTIMIZE, REFERENCE, reference_logits, validation_images
from .effective import load_model, resolve_preprocess
from .engine_stages import ENGINE, ENGINE_INT8
from .precision_stages import FP16, INT8, INT8_TENSORRT
from .rows import Made, Stage
from .validate import validate_artifact

log = logging.getLogger(__name__)

#: The export, in order. Validation waits for the reference logits: model.onnx, written before them,
#: is validated right after the ``reference`` stage.
STAGES: tuple[Stage, ...] = (
    MODEL,
    ONNX,
    REFERENCE,
    ORT_OPTIMIZE,
    FP16,
    INT8,
    BF16,  # a verdict on model.onnx at BF16 (openvino-bf16), where OpenVINO and BF16 math are here
    ENGINE,  # before the INT8 TensorRT graph: what it must beat (engine_stages.engine_timer)
    INT8_TENSORRT,
    ENGINE_INT8,
    MANIFEST,
)

_OUR_NAMES = {
    *ARTIFACT_FILES.values(),
    MANIFEST_NAME,
    EXPORT_REPORT_NAME,
    TIMING_CACHE_NAME,
    SIGNATURE_NAME,  # a new export drops the previous one's signature: `--sign-key` signs the new one
    *(f"{n}.data" for n in ARTIFACT_FILES.values()),
}


@dataclass
class ExportResult:
    """What an export wrote (``vitdeploy.export`` returns it): the folder, each artifact's path by role, every
    gate's validation, the stages' records, what was refused, the memory it measured, and the manifest."""

    out_dir: Path
    stages: list[StageRecord]
    artifacts: dict[str, Path]
    validation: dict[str, Any]
    manifest_path: Path | None
    refused: list[dict[str, Any]] = field(default_factory=list)  # requested stages not met (Refusal.to_dict)
    memory: dict[str, int] = field(default_factory=dict)  # weights_bytes, held_without_model_bytes
    signature: Any = None  # runtime.signature.SignatureInfo of model.sig, when signed (`--sign-key`)

    @functools.cached_property
    def manifest(self) -> Manifest:
        """manifest.json as written, typed (runtime/manifest_schema.py: ``.artifacts``, ``.labels``, ``.io``,
        ``.validation``, ``.stages``...; ``.model_dump()`` is the JSON's dict), read once."""
        if self.manifest_path is None:
            raise ExportError(f"the export in {self.out_dir} wrote no manifest")
        return parse_manifest(read_json_bounded(self.manifest_path, "manifest"), self.manifest_path)


# -- the loop ---------------------------------------------------------------------------------


def run_stages(ctx: ExportContext, table: Sequence[Stage] = STAGES) -> None:
    """Run every row of ``table`` that applies, in order (see the module docstring)."""
    with memory.heap_frozen():
        _run_rows(ctx, table)


def _run_rows(ctx: ExportContext, table: Sequence[Stage]) -> None:
    waiting: list[tuple[Stage, Made]] = []  # made before the reference logits exist
    for row in table:
        if not row.applies(ctx):
            continue
        reason = row.skip(ctx)
        if reason:
            ctx.drop(row.roles)
            ctx.skip(row.name, reason)
            continue
        with _unless_optional(ctx, row):
            with ctx.stage(row.name) as rec:
                memory_budget.check(row.name, ctx.weights, ctx.extra.get("memory", {}).get("held_without_model_bytes"))
                made = row.run(ctx, rec)
                rec.outputs = rec.outputs or [f for artifact in made for f in artifact.files]
            if rec.status != "skipped":  # a stage that found it cannot make its artifact marks itself skipped
                waiting.append((row, made))
            if row.name == ONNX.name:  # the exporter's libraries, imported by this stage, are never garbage
                memory.refreeze()
        while waiting and ctx.reference is not None:
            done, made = waiting.pop(0)
            with _unless_optional(ctx, done):
                _ship(ctx, done, made)
        ctx.close_kept()  # a session kept for this row's validation (context.open_ort) and not taken


@contextlib.contextmanager
def _unless_optional(ctx: ExportContext, row: Stage) -> Iterator[None]:
    """An error of ``row.fallible``: warn, remove what it wrote, go on without it; when the row was
    required (or the error is one of ``row.refused_on``), record the refusal and go on too: the export
    keeps every other artifact and fails at its end (:func:`run_export`)."""
    try:
        yield
    except (*row.fallible, *row.refused_on) as exc:
        if row.required(ctx) or isinstance(exc, row.refused_on):
            ctx.refuse(row.name, row.roles, exc, row.refusal_hint)
            return
        if row.dropped:
            row.dropped(ctx, exc)
        else:
            log.warning("%s not written (the export goes on without it): %s", row.name, exc)
        ctx.drop(row.roles, rejected=True)


def _ship(ctx: ExportContext, row: Stage, made: Made) -> None:
    """Validate what a row made, ask the row whether it ships, add it to the manifest."""
    if row.gate:
        _validate(ctx, row, made)
    if row.ships and not row.ships(ctx, made):
        ctx.drop(row.roles)
        return
    for artifact in made:
        ctx.add(artifact.role, artifact.path, artifact.external)


def _validate(ctx: ExportContext, row: Stage, made: Made) -> None:
    """Run the artifact through its runtime backend; on drift, reject it and raise (exit 3)."""
    gate = row.gate
    assert gate is not None
    sizes = gate.sizes(ctx) if gate.sizes else ctx.sizes
    with ctx.stage(gate.name) as rec:
        backend = gate.open(ctx, made)
        backend.image_sizes = ctx.image_sizes
        judged = ctx.judged.pop(ctx.file_identity(made[0].path), None) if max(sizes) == max(ctx.sizes) else None
        try:
            result = validate_artifact(
                gate.name,
                backend,
                ctx.inputs,
                ctx.reference,
                getattr(ctx.cfg.validation, gate.tolerance).model_dump(),
                sizes,
                largest_logits=judged[0] if judged else None,
                labels=ctx.loaded.labels if ctx.loaded is not None and ctx.kind == "logits" else None,
                kind=ctx.kind,
                patch_reference=ctx.patch_reference,
                largest_patches=judged[1] if judged else None,
                scores=ctx.output.scores if ctx.output is not None else "softmax",
                progress=lambda text: setattr(rec, "progress", text),  # shown while it runs (the heartbeat)
            )
            ctx.validation[gate.name] = result.to_dict()
            failures = result.failures + _validate_other_sizes(ctx, gate, backend, max(sizes))
        finally:
            backend.close()
        if failures and gate.advisory:  # a verdict only: recorded, nothing rejected, the export goes on
            ctx.validation[gate.name]["passed"] = False  # at another size too
            rec.status, rec.reason, rec.details = "failed", "; ".join(failures[:6]), [gate.advisory]
            return
        if failures:
            _reject([f for artifact in made for f in artifact.files])
            rec.reason = "; ".join(failures[:6])
            raise ValidationError(
                f"{gate.name}: {result.backend} output drifted beyond validation thresholds: {rec.reason} "
                f"(artifact renamed *.rejected; full report: {ctx.final_dir / EXPORT_REPORT_NAME}); "
                f"loosen validation.{gate.tolerance} to accept it"
            )
        runs = result.rows or {b: len(ctx.inputs.names) for b in sizes}
        rec.reason = (
            ", ".join(f"{n} inputs at batch {b}" for b, n in sorted(runs.items(), key=lambda kv: -kv[0]))
            + f"; worst max|diff| {result.worst_metrics()['max_abs_diff']:.3g}"
            + (f"; and at {', '.join(map(str, sorted(ctx.other_sizes)))} px" if ctx.other_sizes else "")
        )


def _validate_other_sizes(ctx: ExportContext, gate: Any, backend: Any, batch: int) -> list[str]:
    """An export for several sizes: the artifact judged at every other listed size too, at the largest batch
    (the base size proved batch invariance), with the same thresholds; each size's verdict in the manifest
    (``validation.<gate>.per_size``). The failures, each naming its size."""
    per_size, failures = {}, []
    for side, (inputs, reference) in sorted(ctx.other_sizes.items()):
        result = validate_artifact(
            f"{gate.name}@{side}",
            backend,
            inputs,
            reference,
            getattr(ctx.cfg.validation, gate.tolerance).model_dump(),
            (batch,),
            kind=ctx.kind,
        )
        per_size[str(side)] = result.to_dict()
        failures += [f"at {side} px, {f}" for f in result.failures]
    if per_size:
        ctx.validation[gate.name]["per_size"] = per_size
    return failures


def _reject(paths: list[Path]) -> None:
    for path in paths:
        if path.exists():
            os.replace(path, path.with_name(path.name + ".rejected"))


# -- the entry point --------------------------------------------------------------------------


def _prepare_out_dir(out_dir: Path) -> Path:
    """The folder to export into (symlinks resolved), created, writable, stale temporaries gone."""
    from .staging import clean_stale

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create output directory {out_dir}: {exc.strerror}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ExportError(f"output directory {out_dir} is not writable")
    final = out_dir.resolve()
    clean_stale(final, _OUR_NAMES)
    return final


def run_export(
    cfg: PipelineConfig,
    out_dir: Path | None = None,
    *,
    engine: EngineMode = "auto",
    on_stage: StageCallback | None = None,
    validation_batch: tuple[int, ...] | None = None,
    heartbeat_s: float | None = 1.0,
    sign_key: Path | None = None,
) -> ExportResult:
    """Run every stage the config asks for into ``out_dir`` (default ``export.output_dir``).

    ``on_stage`` is called when a stage starts (status "running", ``seconds`` 0), again every
    ``heartbeat_s`` seconds while it runs (status "running", ``seconds`` elapsed so far; from a
    background thread; None = never) and when it ends. Raises
    ValidationError (exit 3) after writing ``export-report.json`` if an artifact drifts,
    MissingDependencyError (exit 4) for ``engine="require"`` without TensorRT/CUDA. ``sign_key``: an
    elliptic-curve private key (PEM) that signs the export once written (model.sig, runtime/signature.py),
    checked before any stage runs.
    """
    from ..runtime.signature import check_sign_key, sign_export
    from .staging import commit, staged

    if sign_key is not None:
        check_sign_key(sign_key)
    out = Path(out_dir) if out_dir else cfg.output_dir
    final = _prepare_out_dir(out)
    with staged(final, _OUR_NAMES, EXPORT_REPORT_NAME) as (stage, beside):
        ctx = ExportContext(cfg, stage, engine, on_stage, validation_batch, heartbeat_s, final_dir=out)
        try:
            run_stages(ctx)
        except (WriteError, OSError) as exc:  # the disk: named as the file the user would have got
            if isinstance(exc, OSError) and exc.errno not in WriteError.ERRNOS:
                raise
            error = exc if isinstance(exc, WriteError) else WriteError.from_os(exc)
            kept = f"the export already in {out} is untouched" if (final / MANIFEST_NAME).exists() else "no file left"
            named = str(error).replace(str(stage), str(out))
            raise WriteError(f"{named} (nothing of this export was kept; {kept})") from exc
        commit(stage, final, beside, _OUR_NAMES)
    result = ExportResult(
        out,
        ctx.stages,
        {role: out / p.relative_to(stage) for role, p in ctx.artifacts.items()},
        ctx.validation,
        out / MANIFEST_NAME,
        ctx.refusals(),
        dict(ctx.extra.get("memory", {})),
        sign_export(final, sign_key) if sign_key is not None else None,
    )
    if ctx.refused:
        raise _refused(ctx, result)
    return result


def _refused(ctx: ExportContext, result: ExportResult) -> RefusedStagesError:
    """One line for the stages that were asked for and could not be met (each names its key), after
    the export was written without them; the exit code is the first refusal's."""
    reasons = " | ".join(r.line for r in ctx.refused)
    files = ", ".join(name for r in result.refused for name in r["artifacts"]) or "their artifacts"
    return RefusedStagesError(
        f"{reasons} (the export in {result.out_dir} was written without {files}; "
        f"{MANIFEST_NAME} and {EXPORT_REPORT_NAME} record why)",
        [r.error for r in ctx.refused],
        result,
    )


__all__ = [
    "STAGES",
    "ExportContext",
    "ExportResult",
    "StageRecord",
    "load_model",
    "reference_logits",
    "resolve_preprocess",
    "run_export",
    "run_stages",
    "validation_images",
]
