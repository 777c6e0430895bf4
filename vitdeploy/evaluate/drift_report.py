"""What `vitdeploy validate` reports: one row per backend (and size), the whole report as ``drift-report.json``
holds it, and that file read back (its ``served`` entries kept across runs).

The run that fills it is ``drift.py``; a row's verdict ``drift_judge.py``; the table people read ``drift_table.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..base.errors import MissingDependencyError, ValidationError
from ..base.vocab import TORCH

log = logging.getLogger(__name__)

REPORT_FORMAT = "vitdeploy-drift-report"


@dataclass
class BackendDrift:
    """One backend's row: status "reference" | "passed" | "failed" | "error" | "unavailable"."""

    name: str
    status: str
    precision: str = "fp32"
    threshold_set: str | None = None  # "fp32" | "fp16" | None (reference, not run)
    device: str = ""
    describe: str = ""
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    flipped: list[dict[str, Any]] = field(default_factory=list)  # each with both top-3s (vitdeploy report)
    per_image: dict[str, list] = field(default_factory=dict)  # each image's max |diff| and cosine
    accuracy: float | None = None
    seconds: float = 0.0
    #: the square side judged, for an export for several sizes (None: a fixed-size export, or every size)
    image_size: int | None = None

    @property
    def where(self) -> str:
        """The backend's name, and the size its row judged where there is one: "ort at 336 px"."""
        return f"{self.name} at {self.image_size} px" if self.image_size is not None else self.name

    @property
    def ran(self) -> bool:
        return self.status in ("reference", "passed", "failed")

    @property
    def ok(self) -> bool:
        return self.status not in ("failed", "error")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class DriftReport:
    artifacts: str
    model: str
    images: dict[str, Any]
    reference: dict[str, Any]
    thresholds: dict[str, dict[str, float]]
    backends: list[BackendDrift]
    requested: list[str] | None = None  # backend names the caller asked for (None: all)
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""
    report_path: str | None = None
    #: `validate --url`'s checks of running servers (client/served_report.py), kept across `validate` runs
    served: list[dict[str, Any]] = field(default_factory=list)
    #: the sizes judged, an export for several sizes (export.image_sizes); None: a fixed-size export
    image_sizes: list[int] | None = None

    @property
    def passed(self) -> bool:
        return all(b.ok for b in self.backends)

    @property
    def failed(self) -> list[BackendDrift]:
        return [b for b in self.backends if not b.ok]

    @property
    def unavailable(self) -> list[BackendDrift]:
        return [b for b in self.backends if b.status == "unavailable"]

    @property
    def missing_requested(self) -> list[BackendDrift]:
        """Backends the caller named explicitly that cannot run here."""
        return [b for b in self.unavailable if self.requested is not None and b.name in self.requested]

    def backend(self, name: str, image_size: int | None = None) -> BackendDrift:
        """The row of backend ``name`` (at ``image_size``, an export for several sizes; None: its first row)."""
        for b in self.backends:
            if b.name == name and (image_size is None or b.image_size in (image_size, None)):
                return b
        raise KeyError(name if image_size is None else f"{name} at {image_size} px")

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON: non-finite metrics (NaN/inf logits) become the strings "nan" / "inf"."""
        return json_safe(
            {
                "format": REPORT_FORMAT,
                "version": 1,
                "created": self.created,
                "passed": self.passed,
                "artifacts": self.artifacts,
                "model": self.model,
                "images": self.images,
                "reference": self.reference,
                "thresholds": self.thresholds,
                "requested": self.requested,
                **({"image_sizes": self.image_sizes} if self.image_sizes else {}),
                "backends": [b.to_dict() for b in self.backends],
                "versions": self.versions,
                **({"served": self.served} if self.served else {}),
            }
        )

    def raise_for_failures(self) -> None:
        """ValidationError (exit 3) when a backend failed its thresholds or could not run although
        it should; MissingDependencyError (exit 4) when a backend named explicitly cannot run here."""
        if self.failed:
            parts = [f"{b.where}: {'; '.join(b.failures) if b.failures else b.reason}" for b in self.failed]
            where = f"; report: {self.report_path}" if self.report_path else ""
            raise ValidationError(f"drift check failed for {len(self.failed)} backend(s): {' | '.join(parts)}{where}")
        missing = self.missing_requested
        if missing:
            raise MissingDependencyError(
                "requested backend(s) cannot run here: " + "; ".join(f"{b.name} ({b.reason})" for b in missing)
            )


def read_drift_report(path: Path) -> dict[str, Any] | None:
    """The drift report at ``path`` as a dict; None when there is none (or it is not one: a warning)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("%s is not readable JSON (%s): its served section starts anew", path, exc)
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == REPORT_FORMAT else None


def kept_served(path: str | Path, export_sha256: str) -> list[dict[str, Any]]:
    """The ``served`` entries of the report at ``path`` that judged the export ``export_sha256``."""
    doc = read_drift_report(Path(path)) or {}
    entries = doc.get("served") or []
    return [e for e in entries if isinstance(e, dict) and e.get("export_sha256") == export_sha256]


def json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def images_summary(vset: Any, good: Sequence[int], errors: Mapping[int, str], true_index: Sequence, unknown: Sequence):
    """The report's ``images`` section: where the images came from, how many were judged, labelled, unreadable."""
    return {
        "source": vset.source,
        "count": len(vset.paths),
        "evaluated": len(good),
        "labelled": sum(t is not None for t in true_index),
        "label_source": vset.label_source,
        "unknown_labels": sorted(set(unknown)),
        "unmatched_label_rows": list(vset.unmatched_labels),
        "unreadable": [{"path": str(vset.paths[i]), "error": msg} for i, msg in sorted(errors.items())],
    }


def reference_summary(describe: str, accuracy_: float | None, seconds: float) -> dict[str, Any]:
    """The report's ``reference`` section: eager FP32 PyTorch on the CPU, as it ran."""
    return {
        "backend": TORCH,
        "device": "cpu",
        "precision": "fp32",
        "describe": describe,
        "accuracy": accuracy_,
        "seconds": round(seconds, 4),
    }


__all__ = [
    "REPORT_FORMAT",
    "BackendDrift",
    "DriftReport",
    "images_summary",
    "kept_served",
    "read_drift_report",
    "reference_summary",
]
