"""What the report shows, gathered from an export folder: the manifest (the model, its artifacts and the
export's validations), ``drift-report.json`` (`vitdeploy validate`: every backend on real images),
``bench-report.json`` (`vitdeploy bench`: speed on this machine), ``tune-report.json`` and ``loadtest-report.json``
(`vitdeploy tune`, `vitdeploy loadtest -a`: a server measured here). No plotting, no HTML here.

Accuracy per backend comes from the drift report when there is one (it judges every backend, on the user's
images), else from the export's own validations (each graph on the validation inputs). An export for several
sizes has one row per backend and size (``image_size``); what to deploy and what `tune` may serve read one
verdict per backend (:meth:`Facts.per_backend`: failed at any size is failed, each metric its worst size's).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...base.errors import ArtifactError
from ...base.vocab import (
    BENCH_REPORT_NAME,
    DRIFT_REPORT_NAME,
    LOADTEST_REPORT_NAME,
    MANIFEST_NAME,
    OPENVINO_BF16,
    ORT_FP16,
    ORT_INT8,
    TORCH_FP16,
    TRT_INT8,
    TUNE_REPORT_NAME,
    VALIDATE_BF16,
)
from .recommend import Candidate

GPU_NAMES = ("trt", TRT_INT8, TORCH_FP16)
#: the export's validation stages and the backend that runs each artifact (None: not one to deploy by
#: itself: model.onnx is what `ort` runs only without model.ort.onnx, model.int8.trt.onnx is an engine's source)
VALIDATION_BACKENDS = {
    "validate-onnx": ("ort (model.onnx)", None),
    "validate-ort-optimized": ("ort", "ort"),
    "validate-fp16": (ORT_FP16, ORT_FP16),
    "validate-int8": (ORT_INT8, ORT_INT8),
    "validate-int8-trt": ("ort (model.int8.trt.onnx)", None),
    "validate-engine": ("trt", "trt"),
    "validate-engine-int8": (TRT_INT8, TRT_INT8),
    VALIDATE_BF16: (OPENVINO_BF16, OPENVINO_BF16),
}


@dataclass
class AccuracyRow:
    backend: str
    status: str  # "reference" | "passed" | "failed" | "error" | "unavailable"
    metrics: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    per_image: dict[str, list] = field(default_factory=dict)
    flips: list[dict[str, Any]] = field(default_factory=list)  # {"input", "reference": top3, "candidate": top3}
    accuracy: float | None = None
    reason: str = ""
    deployable: bool = True  # a backend `serve -b` runs (not model.onnx beside model.ort.onnx, not an engine's source)
    image_size: int | None = None  # the size judged, an export for several sizes (None: its one size, or every)

    @property
    def label(self) -> str:
        """The backend, and the size judged where there is one: "ort at 336 px"."""
        return f"{self.backend} at {self.image_size} px" if self.image_size is not None else self.backend


@dataclass
class Facts:
    artifacts: Path
    manifest: dict[str, Any]
    accuracy: list[AccuracyRow]
    accuracy_source: str  # where the accuracy rows come from, in words
    bench: dict[str, Any] | None
    machine: dict[str, str]
    tune: dict[str, Any] | None = None  # `vitdeploy tune`'s tune-report.json, where it ran
    loadtest: dict[str, Any] | None = None  # `vitdeploy loadtest -a`'s loadtest-report.json, where it ran
    signature: dict[str, Any] | None = None  # model.sig: who signed what, verified or not (None: unsigned)
    auto: dict[str, Any] | None = None  # what backend "auto" runs on this CPU: its auto-backend.json entry

    def auto_pick(self) -> tuple[str, str] | None:
        """(the backend auto runs on this CPU, its figures in words): its kept measurement, else what it would
        take from the bench report when that was taken on this CPU; None when neither says."""
        from ...runtime.auto_choice import cpu_candidates, describe_figures, fastest

        if self.auto and self.auto.get("chosen"):
            return str(self.auto["chosen"]), describe_figures(self.auto)
        env = (self.bench or {}).get("environment") or {}
        if env.get("cpu_key") != machine_key():
            return None
        passed = {c.name for c in self.candidates() if c.passed}
        ms = {n: v["latency_ms"] for n, v in self.speed_by_backend().items() if n in passed and "latency_ms" in v}
        ms = {n: v for n, v in ms.items() if n in cpu_candidates()}
        if not ms:
            return None
        return fastest(ms, cpu_candidates()), describe_figures({"ms": ms, "source": "bench"})

    def per_backend(self) -> list[AccuracyRow]:
        """One row per backend: an export for several sizes' rows merged (the worst status of its sizes, each metric
        at its worst size; a size that failed is named in the failures)."""
        merged: dict[str, AccuracyRow] = {}
        for row in self.accuracy:
            seen = merged.get(row.backend)
            merged[row.backend] = row if seen is None else _merge(seen, row)
        return list(merged.values())

    def candidates(self) -> list[Candidate]:
        """One per backend that ran, for :func:`vitdeploy.evaluate.report.recommend.recommend`."""
        speed = self.speed_by_backend()
        out = []
        for row in self.per_backend():
            if row.status not in ("reference", "passed", "failed") or not row.deployable:
                continue
            m = row.metrics
            name = row.backend
            out.append(
                Candidate(
                    name=name,
                    passed=row.status in ("reference", "passed"),
                    top1_agreement=float(m.get("top1_agreement", 1.0)),
                    recall_at_k=float(m["recall_at_k"]) if "recall_at_k" in m else None,
                    cosine=float(m.get("cosine", 1.0)),
                    max_abs_diff=float(m.get("max_abs_diff", 0.0)),
                    latency_ms=speed.get(name, {}).get("latency_ms"),
                    images_per_s=speed.get(name, {}).get("images_per_s"),
                    gpu=name in GPU_NAMES,
                    reference=row.status == "reference",
                )
            )
        return out

    def speed_by_backend(self) -> dict[str, dict[str, float]]:
        """backend -> {"latency_ms": p50 at batch 1, "images_per_s": the best measured}, from the bench report."""
        out: dict[str, dict[str, float]] = {}
        for r in (self.bench or {}).get("results", []):
            entry = out.setdefault(r["backend"], {})
            if r["batch_size"] == 1:
                entry["latency_ms"] = float(r["p50_ms"])
            entry["images_per_s"] = max(entry.get("images_per_s", 0.0), float(r["images_per_s"]))
        return out


#: status of merged rows: the first of these any size has
_WORST = ("error", "failed", "unavailable", "passed", "reference")


def _merge(a: AccuracyRow, b: AccuracyRow) -> AccuracyRow:
    """Two sizes' rows of one backend as one verdict: the worse status, each metric's worse value (a difference's
    highest, an agreement's or cosine's lowest), the failures of both, each named by its size."""
    status = min(a.status, b.status, key=lambda s: _WORST.index(s) if s in _WORST else 0)
    metrics = dict(a.metrics)
    for key, value in b.metrics.items():
        if key in metrics and isinstance(value, (int, float)) and isinstance(metrics[key], (int, float)):
            metrics[key] = max(metrics[key], value) if "diff" in key else min(metrics[key], value)
        else:
            metrics.setdefault(key, value)
    failures = [f"at {r.image_size} px, {f}" if r.image_size is not None else f for r in (a, b) for f in r.failures]
    return AccuracyRow(
        backend=a.backend,
        status=status,
        metrics=metrics,
        thresholds=a.thresholds,
        failures=failures,
        accuracy=None if a.accuracy is None or b.accuracy is None else min(a.accuracy, b.accuracy),
        reason=a.reason or b.reason,
        deployable=a.deployable and b.deployable,
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not readable JSON ({exc})") from None
    return data if isinstance(data, dict) else None


def _from_drift(drift: dict[str, Any]) -> list[AccuracyRow]:
    return [_row(b, b["name"]) for b in drift.get("backends", [])]


def _from_served(drift: dict[str, Any] | None) -> list[AccuracyRow]:
    """`validate --url`'s checks: one "served" row per server, protocol and model, never a deployment candidate."""
    rows = []
    for entry in (drift or {}).get("served") or []:
        if not isinstance(entry, dict):
            continue
        row = _row(entry, f"served: {entry.get('url')} ({entry.get('protocol')})")
        row.deployable = False
        judged = f"judged with the {entry['backend']} thresholds" if entry.get("backend") else ""
        row.reason = "; ".join(x for x in (entry.get("reason", ""), judged, entry.get("created", "")) if x)
        rows.append(row)
    return rows


def _row(b: dict[str, Any], name: str) -> AccuracyRow:
    return AccuracyRow(
        backend=name,
        status=b["status"],
        metrics=b.get("metrics") or {},
        thresholds=b.get("thresholds") or {},
        failures=list(b.get("failures") or []),
        per_image=b.get("per_image") or {},
        flips=[
            {"input": f["path"], "reference": f.get("reference_top3", []), "candidate": f.get("candidate_top3", [])}
            for f in b.get("flipped") or []
        ],
        accuracy=b.get("accuracy"),
        reason=b.get("reason", ""),
        image_size=b.get("image_size"),
    )


def _from_manifest(manifest: dict[str, Any]) -> list[AccuracyRow]:
    rows = [AccuracyRow("torch", "reference", {"top1_agreement": 1.0, "cosine": 1.0, "max_abs_diff": 0.0})]
    has_ort = "validate-ort-optimized" in (manifest.get("validation") or {})
    for stage, result in (manifest.get("validation") or {}).items():
        shown, runs = VALIDATION_BACKENDS.get(stage, (result.get("backend", stage), result.get("backend")))
        if stage == "validate-onnx" and not has_ort:
            shown, runs = "ort", "ort"  # without model.ort.onnx, `ort` runs model.onnx
        per_size = result.get("per_size") or {}  # an export for several sizes: the other sizes' verdicts
        base = _base_size(manifest) if per_size else None
        sizes = sorted([(base, result), *((int(k), v) for k, v in per_size.items())], key=lambda t: t[0] or 0)
        for size, judged in sizes:
            rows.append(
                AccuracyRow(
                    backend=shown,
                    deployable=runs is not None,
                    status="passed" if judged.get("passed") else "failed",
                    metrics=judged.get("metrics") or {},
                    thresholds=judged.get("thresholds") or {},
                    failures=list(judged.get("failures") or []),
                    per_image=judged.get("per_image") or {},
                    flips=list(judged.get("flips") or []),
                    reason=stage,
                    image_size=size,
                )
            )
    return rows


def _base_size(manifest: dict[str, Any]) -> int | None:
    """The side of the manifest's io.input (an export's base size), None where it does not say."""
    shape = ((manifest.get("io") or {}).get("input") or {}).get("shape") or []
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def machine_key() -> str:
    """This CPU's key (its model and flags): what auto's measurements and a bench's figures are kept under."""
    from ...base.machine import cpu_key

    return cpu_key()


def _auto_entry(folder: Path) -> dict[str, Any] | None:
    """This CPU's entry of auto's kept measurement for the export in ``folder`` (None: not measured here)."""
    from ...runtime.auto_choice import cache_path, read_entries

    entry = read_entries(cache_path(folder)).get(machine_key())
    return entry if isinstance(entry, dict) else None


def machine() -> dict[str, str]:
    from ...base.machine import describe_cpu

    gpu = "none"
    try:
        from ...runtime.cuda import cuda_status, gpu_identity

        if cuda_status(None)[0]:
            gpu = gpu_identity(None).describe()
    except Exception:  # noqa: BLE001 - a report never fails for want of a GPU probe
        pass
    return {
        "cpu": describe_cpu(),
        "cores": str(os.cpu_count() or "?"),
        "gpu": gpu,
        "platform": f"{platform.platform()}, Python {platform.python_version()}",
    }


def gather(
    artifacts: str | os.PathLike[str], bench: dict[str, Any] | None = None, public_key: Path | None = None
) -> Facts:
    """The facts of the export in ``artifacts`` (``bench``: a bench report to use instead of the saved one;
    ``public_key``: the key its signature is checked with, if it has one)."""
    from ...runtime.signature import signature_status

    folder = Path(artifacts)
    manifest = _read_json(folder / MANIFEST_NAME)
    if manifest is None:
        raise ArtifactError(f"{folder}: no {MANIFEST_NAME}; run `vitdeploy export` first (-a names the export folder)")
    drift = _read_json(folder / DRIFT_REPORT_NAME)
    if drift is not None and drift.get("backends"):
        seen = drift.get("images", {})
        rows = _from_drift(drift)
        source = (
            f"`vitdeploy validate` ({DRIFT_REPORT_NAME}, {drift.get('created', '?')}): every backend on "
            f"{seen.get('evaluated', '?')} image(s) of {seen.get('source', '?')}"
        )
    else:
        inputs = manifest.get("validation_inputs") or {}
        count = inputs.get("count", "?") if isinstance(inputs, dict) else len(inputs)
        rows = _from_manifest(manifest)
        source = (
            f"the export's own validations ({MANIFEST_NAME}): each artifact on its {count} validation inputs; "
            "`vitdeploy validate` judges every backend on your images"
        )
    served = _from_served(drift)
    if served:
        source += "; served: `vitdeploy validate --url`, a running server's answers to the same kind of images"
    return Facts(
        folder,
        manifest,
        rows + served,
        source,
        bench if bench is not None else _read_json(folder / BENCH_REPORT_NAME),
        machine(),
        _read_json(folder / TUNE_REPORT_NAME),
        _read_json(folder / LOADTEST_REPORT_NAME),
        signature_status(folder, public_key),
        _auto_entry(folder),
    )


__all__ = ["AccuracyRow", "BENCH_REPORT_NAME", "Facts", "gather", "machine"]
