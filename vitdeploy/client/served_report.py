"""`vitdeploy validate --url`'s results: a running server's answers judged against eager PyTorch, kept in
``drift-report.json``'s ``served`` section and shown beside the in-process backends (the table, the report page).

What a check found is a :class:`ServedCheck`: the server (URL, protocol, model), the export it says it runs and
the backend whose thresholds judged it, and the row of the ``served`` answers, judged as `validate` judges a
backend (:func:`vitdeploy.evaluate.drift_judge.judge_backend`). The requests themselves are the client's
(served_check.py, beside it). In ``drift-report.json`` a check is one entry of ``served``, one per
(URL, protocol, model, image size asked): a later check of the same server replaces it; `validate` keeps the
entries of the same export (its manifest's sha256) when it rewrites the report.
"""

from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base._files import write_json_atomic
from ..base.errors import OtherExportError, ValidationError
from ..base.vocab import EXPORT_SHA256
from ..evaluate.drift_report import REPORT_FORMAT, BackendDrift, DriftReport, json_safe, kept_served, read_drift_report
from ..evaluate.drift_table import format_drift_table

log = logging.getLogger(__name__)

#: the served answers' row name, in the table and the report
SERVED = "served"
#: what was compared, by what the answers hold
COMPARED = {
    "logits": "the LOGITS output",
    "embedding": "the EMBEDDINGS output",
    "scores": "the top-k softmax scores of /predict (it answers no logits)",
}


@dataclass
class ServedCheck:
    """One `validate --url`: the server, the export it says it runs, and its answers judged (``drift``)."""

    url: str
    protocol: str
    model: str | None
    export_sha256: str  # the export named by -a (its manifest's sha256)
    server_sha256: str | None  # the export the server says it runs; None: it does not say
    server_backend: str | None  # the backend the server says it runs
    backend: str  # whose thresholds judged the answers
    backend_source: str  # "server" or "--backend"
    compared: str = "logits"  # a key of COMPARED
    status: str = "passed"  # "passed" | "failed" | "refused"
    reason: str = ""  # a refusal's one line
    drift: DriftReport | None = None  # images, reference and the one "served" row (None when refused)
    failed_requests: list[dict[str, str]] = field(default_factory=list)  # {"path", "status", "error"}
    notes: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    report_path: str | None = None
    image_size: int | None = None  # the size asked of the server (--image-size); None: none asked

    @property
    def row(self) -> BackendDrift | None:
        return self.drift.backends[0] if self.drift and self.drift.backends else None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def key(self) -> tuple[str, str, str | None, int | None]:
        """One entry per server, protocol, model and size judged (an export for several sizes)."""
        return (self.url, self.protocol, self.model, self.row.image_size if self.row else self.image_size)

    def to_dict(self) -> dict[str, Any]:
        """The ``served`` entry of drift-report.json (strict JSON)."""
        row = (
            self.row.to_dict()
            if self.row
            else {"name": SERVED, "status": self.status, "failures": [], "image_size": self.image_size}
        )
        entry = {
            **row,
            "status": self.status,
            "url": self.url,
            "protocol": self.protocol,
            "model": self.model,
            "export_sha256": self.export_sha256,
            "server": {"export_sha256": self.server_sha256, "backend": self.server_backend},
            "backend": self.backend,
            "backend_source": self.backend_source,
            "compared": self.compared,
            "reason": self.reason or row.get("reason", ""),
            "failed_requests": self.failed_requests,
            "notes": self.notes,
            "created": self.created,
        }
        if self.drift is not None:
            entry["images"] = self.drift.images
            entry["reference"] = self.drift.reference
        return json_safe(entry)

    def raise_for_failures(self) -> None:
        """OtherExportError for a refusal; ValidationError (exit 3) when the answers failed the gate."""
        where = f"; report: {self.report_path}" if self.report_path else ""
        if self.status == "refused":
            raise OtherExportError(self.reason)
        if self.status == "failed":
            failures = "; ".join(self.row.failures) if self.row else self.reason
            raise ValidationError(f"the server at {self.url} ({self.protocol}) failed: {failures}{where}")


def served_line(check: ServedCheck) -> str:
    """Who answered: the server, the export it runs and the thresholds that judge it, in one line."""
    says = (
        f"runs export {check.server_sha256[:12]}"
        if check.server_sha256
        else f"does not say which export it runs (no {EXPORT_SHA256} in its model configuration)"
    )
    model = f", model {check.model}" if check.model else ""
    size = f", asked for {check.image_size} px" if check.image_size is not None else ""
    line = f"server: {check.url} ({check.protocol}{model}{size}) {says}"
    if check.backend:
        source = "said by the server" if check.backend_source == "server" else "--backend"
        line += f"; judged with the {check.backend} thresholds ({source})"
    return line


def format_served(check: ServedCheck) -> list[str]:
    """The human-readable check: the server line, then the same table as `validate` with the ``served`` row."""
    lines = [served_line(check), f"export: {check.export_sha256[:12]} (the -a folder's manifest)"]
    if check.status == "refused" or check.drift is None:
        return lines  # the refusal is the command's error line
    lines.append(f"compared: {COMPARED.get(check.compared, check.compared)}, one image per request")
    lines += [f"note: {note}" for note in check.notes]
    lines += [""] + format_drift_table(check.drift)
    shown = [f"  {SERVED} no answer: {bad['path']} ({bad['status']}: {bad['error']})" for bad in check.failed_requests]
    where = f"; report: {check.report_path}" if check.report_path else ""
    verdict = (
        f"PASSED: the server's answers are within the {check.backend} thresholds"
        if check.passed
        else f"FAILED: the server's answers are not within the {check.backend} thresholds"
    )
    return lines[:-1] + shown[:10] + [verdict + where]


# ------------------------------------------------------------------------------------------------
# drift-report.json


def save_served(check: ServedCheck, path: str | Path, artifacts: Any) -> Path:
    """Put ``check`` into the ``served`` section of the drift report at ``path`` (its entry for the same server,
    protocol and model replaced; a report is started when there is none), atomically."""
    target = Path(path)
    doc = read_drift_report(target)
    if doc is None:
        doc = {
            "format": REPORT_FORMAT,
            "version": 1,
            "created": check.created,
            "passed": None,  # no in-process backend judged yet: `vitdeploy validate` fills them in
            "artifacts": str(artifacts.directory),
            "model": artifacts.name,
            "backends": [],
        }
    kept = [
        e
        for e in kept_served(target, check.export_sha256)
        if (e.get("url"), e.get("protocol"), e.get("model"), e.get("image_size")) != check.key()
    ]
    doc["served"] = kept + [check.to_dict()]
    write_json_atomic(target, doc)
    check.report_path = str(target)
    return target


__all__ = ["COMPARED", "SERVED", "ServedCheck", "format_served", "kept_served", "save_served", "served_line"]
