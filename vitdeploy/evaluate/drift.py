"""`vitdeploy validate`: how far each runtime backend drifts from eager FP32 PyTorch on real images.

    report = run_drift("artifacts/")                      # the demo images, every backend here
    print("\\n".join(format_drift_table(report)))       # drift_table.py
    report.raise_for_failures()                           # ValidationError (exit 3) on any failure

The validation set (the shipped demo images by default, or a folder of the user's) is decoded and
preprocessed once with the shared :class:`~vitdeploy.runtime.preprocess.Preprocessor`
(unreadable images are listed, not fatal) and every backend gets the same float32 batch. The
reference is the ``torch`` backend on the CPU in FP32. Per backend: max / mean absolute logit
difference, cosine similarity (worst image), top-1 agreement, top-5 overlap, the images whose
top-1 class flipped, and accuracy where true labels are known. Each metric is judged against the
``validation.fp32`` thresholds (``ort``, ``torch`` FP32 on another device) or
``validation.fp16`` (``ort-fp16``, ``torch-fp16``, ``trt``) or ``validation.int8`` (``ort-int8``).

Backends that cannot run here are listed with the reason, never dropped. This module is the run; the report it
returns (its rows, its JSON) is ``drift_report.py``'s, each row's verdict ``drift_judge.py``'s.

An export for several sizes (manifest ``image_sizes``) is judged at every listed size, or at the one size asked
(``image_size``): each size's preprocessing of the same images, eager PyTorch at that size as its reference, one
row per backend and size (``image_size`` in the row; a backend that cannot run here is one row for all sizes).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..base._files import write_json_atomic
from ..base.errors import BackendError, ConfigError, InputError, MissingDependencyError
from ..base.vocab import DRIFT_REPORT_NAME, PRECISIONS
from ..export.manifest import library_versions
from ..runtime.backends import first_line
from .dataset import label_indices, load_validation_set
from .drift_judge import accuracy, judge_backend
from .drift_report import BackendDrift, DriftReport, images_summary, kept_served, reference_summary
from .specs import (
    BackendSpec,
    backend_specs,
    open_spec,
    parse_backend_names,
    reference_options,
    spec_unavailable_reason,
    try_open_spec,
)

log = logging.getLogger(__name__)


def default_thresholds() -> dict[str, dict[str, float]]:
    from ..base.export_sections import ValidationSection

    section = ValidationSection()
    return {key: getattr(section, key).model_dump() for key in PRECISIONS}


def _as_dict(tolerance: Any) -> dict[str, float]:
    data = tolerance.model_dump() if hasattr(tolerance, "model_dump") else dict(tolerance)
    return {str(k): float(v) for k, v in data.items()}


def run_drift(
    artifacts_dir: str | os.PathLike[str] | Any,
    *,
    images: str | os.PathLike[str] | None = None,
    labels_file: str | os.PathLike[str] | None = None,
    backends: str | Sequence[str] | None = None,
    thresholds: Mapping[str, Any] | None = None,
    options: Any = None,
    max_pixels: int | None = None,
    write_report: bool = True,
    report_path: str | os.PathLike[str] | None = None,
    image_size: int | None = None,
) -> DriftReport:
    """Run every backend that can run here (or those in ``backends``) over the validation set and
    judge each against eager FP32 PyTorch on the CPU. Never raises for drift: inspect
    ``report.passed`` or call ``report.raise_for_failures()``.

    An export for several sizes is judged at each listed size (``image_size``: at that one only; InputError
    naming the sizes that work for another), one row per backend and size.

    ``thresholds``: {"fp32": Tolerance or dict, "fp16": ...} (default: the config defaults).
    ``options``: BackendOptions for the backends (device, providers, threads). The report is
    written atomically to ``artifacts_dir/drift-report.json`` (or ``report_path``) unless
    ``write_report`` is False. Raises InputError when no image can be read, ArtifactError for a
    tampered artifact, MissingDependencyError when torch (the reference) is missing.
    """
    from ..runtime.artifacts import Artifacts
    from ..runtime.backends import BackendOptions

    options = options or BackendOptions()
    requested = parse_backend_names(backends)
    specs = backend_specs(requested, options)
    limits = default_thresholds()
    for key, value in (thresholds or {}).items():
        if key not in limits:
            raise ConfigError(f"thresholds: unknown set {key!r}; expected one of {', '.join(PRECISIONS)}")
        limits[key] = _as_dict(value)
    artifacts = Artifacts.open(artifacts_dir)
    sizes = drift_sizes(artifacts, image_size)

    vset, batch, good, errors, true_index, unknown = validation_batch(
        artifacts, images, labels_file, max_pixels, size=sizes[0]
    )
    names = [str(vset.paths[i]) for i in good]
    runs, ref_describe = size_runs(artifacts, options, sizes, batch, [vset.paths[i] for i in good], max_pixels)
    for run in runs:
        run.accuracy = accuracy(run.reference[0], true_index)

    # 3. every backend, on the same batches
    rows: list[BackendDrift] = []
    for spec in specs:
        rows += _run_spec(spec, artifacts, runs, limits, names, true_index, ref_describe)

    report = DriftReport(
        artifacts=str(artifacts.directory),
        model=artifacts.name,
        images=images_summary(vset, good, errors, true_index, unknown),
        reference=sized_reference_summary(ref_describe, runs, artifacts.input_shape[1]),
        thresholds=limits,
        backends=rows,
        requested=list(requested) if requested else None,
        versions=library_versions(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        image_sizes=[r.size for r in runs] if runs[0].size is not None else None,
    )
    if write_report:
        target = Path(report_path) if report_path else artifacts.directory / DRIFT_REPORT_NAME
        report.served = kept_served(target, artifacts.manifest_sha256)
        try:
            write_json_atomic(target, report.to_dict())
            report.report_path = str(target)
        except OSError as exc:
            log.warning("could not write the drift report to %s: %s", target, exc)
    return report


def sized_reference_summary(describe: str, runs: Sequence["SizeRun"], base: int) -> dict[str, Any]:
    """The ``reference`` section of a drift run: its accuracy and time at the base size (else the first size
    judged); an export for several sizes adds ``per_size`` ({"336": {"accuracy", "seconds"}})."""
    main = next((r for r in runs if r.size in (None, base)), runs[0])
    summary = reference_summary(describe, main.accuracy, main.seconds)
    if main.size is not None:
        summary["image_size"] = main.size
        summary["per_size"] = {str(r.size): {"accuracy": r.accuracy, "seconds": round(r.seconds, 4)} for r in runs}
    return summary


def validation_batch(
    artifacts: Any, images: Any, labels_file: Any, max_pixels: int | None, *, size: int | None = None
) -> tuple[Any, np.ndarray, list[int], dict, list, list]:
    """The validation images, preprocessed once (at ``size``, one of an export's image sizes; None: its base
    size): (set, batch, readable indices, {index: error}, true class index per readable image (None:
    unlabelled), labels that are no class of the model)."""
    vset = load_validation_set(images, labels_file)
    pre = _preprocessor(artifacts, size, max_pixels)
    started = time.perf_counter()
    batch, good, errors = pre.batch_tolerant(list(vset.paths))
    if not good:
        first = next(iter(errors.values()), "no images")
        raise InputError(f"no readable image among the {len(vset.paths)} in {vset.source} (first error: {first})")
    if artifacts.schema.is_embedding:  # a vector has no class: true labels, if any, are not used
        return vset, batch, good, errors, [None] * len(good), []
    true_index, unknown = label_indices([vset.labels[i] for i in good], artifacts.labels)
    if unknown and all(t is None for t in true_index):
        raise InputError(
            f"none of the true labels ({vset.label_source}) is a class of the model, e.g. {unknown[0]!r}; "
            f"the model's classes are {artifacts.labels[:10]}{' ...' if len(artifacts.labels) > 10 else ''}"
        )
    if unknown:
        log.warning(
            "%d image(s) have labels that are no class of the model (e.g. %r); left out of accuracy",
            len(unknown),
            unknown[0],
        )
    log.info(
        "validation set: %d image(s) from %s preprocessed in %.2fs (%d unreadable)",
        len(good),
        vset.source,
        time.perf_counter() - started,
        len(errors),
    )
    return vset, batch, good, errors, true_index, unknown


def _preprocessor(artifacts: Any, size: int | None, max_pixels: int | None) -> Any:
    from ..runtime.images import MAX_IMAGE_PIXELS
    from ..runtime.preprocess import Preprocessor

    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    return Preprocessor(artifacts.preprocess_at(size), max_pixels=limit)


def drift_sizes(artifacts: Any, image_size: int | None) -> list[int | None]:
    """The sizes a drift run judges: ``image_size`` alone (InputError naming the sizes that work when the export
    does not answer at it), else every size of an export for several sizes; [None]: a fixed-size export's one."""
    if image_size is not None:
        artifacts.preprocess_at(image_size)  # refuses a size not listed, naming those that work
        return [int(image_size)] if artifacts.image_sizes else [None]
    return list(artifacts.image_sizes) or [None]


@dataclass
class SizeRun:
    """The validation images at one size (None: a fixed-size export's): the batch, and eager PyTorch's outputs
    over it (logits or embeddings[, patch tokens]) with its time and accuracy."""

    size: int | None
    batch: np.ndarray
    reference: tuple[np.ndarray, ...] = ()
    seconds: float = 0.0
    accuracy: float | None = None


def size_runs(
    artifacts: Any, options: Any, sizes: Sequence[int | None], first: np.ndarray, paths: Sequence[Any], max_pixels
) -> tuple[list[SizeRun], str]:
    """Each size's batch (``first``: the first size's, already made; the others from the same readable
    ``paths``) and eager PyTorch's outputs over it, through one eager model: (runs, its description)."""
    runs = [SizeRun(sizes[0], first)]
    runs += [SizeRun(s, _preprocessor(artifacts, s, max_pixels).batch(list(paths))) for s in sizes[1:]]
    with _eager(artifacts, options) as ref_backend:
        for run in runs:
            t0 = time.perf_counter()
            run.reference = _run_outputs(ref_backend, artifacts, run.batch)
            run.seconds = time.perf_counter() - t0
        return runs, ref_backend.describe()


def _run_outputs(backend: Any, artifacts: Any, batch: np.ndarray) -> tuple[np.ndarray, ...]:
    """(logits or embeddings,) of ``backend`` over ``batch``; and the patch tokens where the export has them."""
    return backend.run_all(batch)[:2] if artifacts.schema.patch_shape is not None else (backend.run(batch),)


@contextlib.contextmanager
def _eager(artifacts: Any, options: Any) -> Iterator[Any]:
    """Eager FP32 PyTorch on the CPU, opened (MissingDependencyError where it cannot run) and closed after."""
    ref_spec = BackendSpec("torch", "torch", reference_options(options), "fp32")
    reason = spec_unavailable_reason(ref_spec, artifacts)
    if reason:
        raise MissingDependencyError(
            f"validate needs eager PyTorch on the CPU as its reference, which cannot run "
            f"here: {reason} (pip install torch==2.13.0 safetensors)"
        )
    ref_backend = open_spec(ref_spec, artifacts)
    try:
        yield ref_backend
    finally:
        ref_backend.close()


def eager_reference(artifacts: Any, options: Any, batch: np.ndarray) -> tuple[tuple[np.ndarray, ...], float, str]:
    """Eager FP32 PyTorch on the CPU over ``batch``: ((logits[, patch tokens]), seconds, its description)."""
    with _eager(artifacts, options) as ref_backend:
        t0 = time.perf_counter()
        reference = _run_outputs(ref_backend, artifacts, batch)
        return reference, time.perf_counter() - t0, ref_backend.describe()


def _run_spec(
    spec: BackendSpec,
    artifacts: Any,
    runs: Sequence[SizeRun],
    limits: Mapping[str, Mapping[str, float]],
    names: Sequence[str],
    true_index: Sequence[int | None],
    ref_describe: str,
) -> list[BackendDrift]:
    """One backend's rows, one per size of ``runs`` (each with eager's outputs at that size); one row for every
    size when it cannot run or open here."""
    device = spec.device
    if spec.is_reference:
        return [
            BackendDrift(
                name=spec.name,
                status="reference",
                precision="fp32",
                device="cpu",
                describe=ref_describe,
                reason="eager FP32 PyTorch on the CPU: the reference",
                metrics=_self_metrics(run.reference, artifacts.schema.output.kind)[0],
                accuracy=run.accuracy,
                seconds=round(run.seconds, 4),
                image_size=run.size,
            )
            for run in runs
        ]
    attempt = try_open_spec(spec, artifacts)  # tampered files raise ArtifactError here, before any fallback
    if attempt.status == "unavailable":
        log.info("%s: unavailable (%s)", spec.name, attempt.reason)
        return [
            BackendDrift(
                name=spec.name,
                status="unavailable",
                precision=spec.precision,
                threshold_set=spec.precision,
                device=device,
                reason=attempt.reason,
                thresholds=dict(limits[spec.precision]),
            )
        ]
    if attempt.backend is None:  # e.g. an engine built for another GPU
        return [_error_row(spec, device, limits, f"cannot open: {attempt.reason}")]
    backend = attempt.backend
    try:
        describe = backend.describe()
        return [_judge_run(spec, backend, describe, device, artifacts, run, limits, names, true_index) for run in runs]
    finally:
        backend.close()


def _judge_run(
    spec: BackendSpec,
    backend: Any,
    describe: str,
    device: str,
    artifacts: Any,
    run: SizeRun,
    limits: Mapping[str, Mapping[str, float]],
    names: Sequence[str],
    true_index: Sequence[int | None],
) -> BackendDrift:
    """The open ``backend`` over one size's batch, judged against eager's outputs at that size."""
    outputs, reference = run.reference, run.reference[0]
    try:
        t0 = time.perf_counter()
        got = _run_outputs(backend, artifacts, run.batch)
        logits, seconds = got[0], time.perf_counter() - t0
    except (BackendError, InputError) as exc:
        return _error_row(spec, device, limits, f"failed to run: {first_line(exc)}", run.size)
    if any(np.shape(a) != np.shape(b) for a, b in zip(got, outputs)) or len(got) != len(outputs):
        return _error_row(
            spec,
            device,
            limits,
            f"returned logits of shape {np.shape(logits)}, the reference "
            f"{np.shape(reference)}; re-run `vitdeploy export`",
            run.size,
        )
    row = judge_backend(
        spec.name,
        logits,
        reference,
        limits[spec.precision],
        names=names,
        true_index=true_index,
        classes=artifacts.labels,
        precision=spec.precision,
        kind=artifacts.schema.output.kind,
        patches=(outputs[1], got[1]) if len(outputs) > 1 and len(got) > 1 else None,
        scores=artifacts.schema.output.scores,
    )
    row.device, row.describe, row.seconds, row.image_size = device, describe, round(seconds, 4), run.size
    log.info("%s: %s (%s)", row.where, row.status, "; ".join(row.failures) or "within thresholds")
    return row


def _error_row(
    spec: BackendSpec,
    device: str,
    limits: Mapping[str, Mapping[str, float]],
    reason: str,
    image_size: int | None = None,
) -> BackendDrift:
    log.warning("%s%s: %s", spec.name, f" at {image_size} px" if image_size is not None else "", reason)
    return BackendDrift(
        name=spec.name,
        status="error",
        precision=spec.precision,
        threshold_set=spec.precision,
        device=device,
        reason=reason,
        thresholds=dict(limits[spec.precision]),
        image_size=image_size,
    )


def _self_metrics(outputs: tuple[np.ndarray, ...], kind: str = "logits") -> tuple[dict[str, float], tuple[int, ...]]:
    from ..export.compare import output_metrics

    patches = (outputs[1], outputs[1]) if len(outputs) > 1 else None
    return output_metrics(outputs[0], outputs[0], kind, patches=patches)


__all__ = [
    "SizeRun",
    "default_thresholds",
    "drift_sizes",
    "eager_reference",
    "library_versions",
    "run_drift",
    "size_runs",
    "sized_reference_summary",
    "validation_batch",
]
