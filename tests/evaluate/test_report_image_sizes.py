"""The report of an export for several sizes: the accuracy table shows the size beside the backend (from the drift
report, or the export's own per-size validations), and what to deploy and what `tune` may serve read one verdict
per backend: a backend that failed at one size is failed, named with that size, never recommended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")

from vitdeploy.evaluate.report import write_report  # noqa: E402
from vitdeploy.evaluate.report.facts import gather  # noqa: E402

METRICS = {"max_abs_diff": 1e-6, "cosine": 1.0, "recall_at_k": 1.0, "k": 10}
MANIFEST = {
    "name": "sized",
    "created": "2026-11-28T00:00:00+00:00",
    "model": {"vit": {"width": 64}},
    "io": {"input": {"name": "images", "shape": ["batch", 3, 56, 56]}},
    "preprocess": {"height": 56, "width": 56},
    "artifacts": {},
    "versions": {},
}


def _row(name: str, size: int | None, status: str = "passed", **extra) -> dict:
    metrics = {**METRICS, **extra.pop("metrics", {})}
    return {"name": name, "status": status, "metrics": metrics, "image_size": size, "failures": [], **extra}


def _folder(tmp_path: Path, backends: list[dict] | None, validation: dict | None = None) -> Path:
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({**MANIFEST, "validation": validation or {}}))
    if backends is not None:
        drift = {"created": "now", "images": {"evaluated": 2, "source": "imgs"}, "image_sizes": [28, 56]}
        (folder / "drift-report.json").write_text(json.dumps({**drift, "backends": backends}))
    return folder


def _accuracy_rows(folder: Path) -> str:
    path, _, _ = write_report(folder, images=False)
    page = path.read_text(encoding="utf-8")
    start = page.index("<h2 id='accuracy'>")
    return page[start : page.index("<h2 ", start + 1)]


def test_a_backend_failed_at_one_size_is_failed_and_not_recommended(tmp_path):
    bad = "max_abs_diff 0.02 > 0.001"
    folder = _folder(
        tmp_path,
        [
            _row("torch", 28, "reference"),
            _row("torch", 56, "reference"),
            _row("ort", 28),
            _row("ort", 56, "failed", failures=[bad], metrics={"max_abs_diff": 0.02, "cosine": 0.999}),
            _row("ort-int8", 28),
            _row("ort-int8", 56),
            {"name": "trt", "status": "unavailable", "reason": "no engine", "image_size": None},
        ],
    )
    facts = gather(folder)
    verdicts = {r.backend: r for r in facts.per_backend()}
    ort = verdicts["ort"]
    assert ort.status == "failed" and ort.failures == [f"at 56 px, {bad}"]
    assert ort.metrics["max_abs_diff"] == 0.02 and ort.metrics["cosine"] == 0.999  # each metric's worst size
    assert verdicts["ort-int8"].status == "passed" and verdicts["torch"].status == "reference"
    assert [c.name for c in facts.candidates()] == ["torch", "ort", "ort-int8"]  # one candidate per backend

    accuracy = _accuracy_rows(folder)
    assert "<th>backend</th><th>size</th><th>verdict</th>" in accuracy
    assert "<tr><td>ort</td><td>56 px</td><td><span class='bad'>failed</span>" in accuracy
    assert "<tr><td>ort</td><td>28 px</td><td><span class='ok'>passed</span>" in accuracy
    assert "<tr><td>trt</td><td>all</td>" in accuracy
    page = (folder / "report.html").read_text(encoding="utf-8")
    deploy = page[page.index("<h2 id='deploy'>") : page.index("<h2 id='accuracy'>")]
    assert "<strong>ort</strong>" not in deploy and "never recommended, however fast: ort " in deploy


def test_without_a_drift_report_the_exports_own_per_size_validations_are_shown_by_size(tmp_path):
    judged = {"passed": True, "metrics": METRICS}
    entry = {**judged, "backend": "ort", "per_size": {"28": {"passed": False, "metrics": METRICS}}}
    folder = _folder(tmp_path, None, {"validate-ort-optimized": entry})
    rows = [(r.backend, r.image_size, r.status) for r in gather(folder).accuracy if r.backend == "ort"]
    assert rows == [("ort", 28, "failed"), ("ort", 56, "passed")]  # io.input's 56: the base size
    accuracy = _accuracy_rows(folder)
    assert "<tr><td>ort</td><td>28 px</td><td><span class='bad'>failed</span>" in accuracy


def test_a_fixed_size_report_has_no_size_column(tmp_path):
    folder = _folder(tmp_path, [_row("torch", None, "reference"), _row("ort", None)])
    assert "<th>size</th>" not in _accuracy_rows(folder)
