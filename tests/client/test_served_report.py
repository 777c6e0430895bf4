"""drift-report.json's served section (`vitdeploy validate --url`): one entry per server, protocol and model, a
later check of the same replacing it, the checks of another export dropped; the table is `validate`'s, under a
line saying which server and export were judged; a refusal is the command's one error line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vitdeploy.base.errors import OtherExportError, ValidationError
from vitdeploy.client.served_report import SERVED, ServedCheck, format_served, save_served
from vitdeploy.evaluate.drift_report import BackendDrift, DriftReport, kept_served

SHA, OTHER = "a" * 64, "b" * 64


def _check(url: str, status: str = "passed", sha: str = SHA, failures: tuple[str, ...] = ()) -> ServedCheck:
    row = BackendDrift(SERVED, status, "int8", "int8", metrics={"max_abs_diff": 0.02, "top1_agreement": 1.0})
    row.failures = list(failures)
    drift = DriftReport(
        "export",
        "m",
        {"source": "imgs", "evaluated": 3, "labelled": 0, "label_source": "none", "unreadable": []},
        {"describe": "torch", "accuracy": None},
        {},
        [row],
    )
    return ServedCheck(url, "v2-http", "m", sha, sha, "ort-int8", "ort-int8", "server", status=status, drift=drift)


def test_a_later_check_of_the_same_server_replaces_its_entry_and_another_exports_are_dropped(tmp_path):
    path, artifacts = tmp_path / "drift-report.json", SimpleNamespace(directory=tmp_path, name="m")
    save_served(_check("http://a:1"), path, artifacts)
    save_served(_check("http://b:2"), path, artifacts)
    save_served(_check("http://a:1", "failed", failures=("max_abs_diff: expected <= 0, got 0.02",)), path, artifacts)
    doc = json.loads(path.read_text())
    assert doc["backends"] == [] and doc["passed"] is None  # no in-process backend judged yet
    assert [(e["url"], e["status"]) for e in doc["served"]] == [("http://b:2", "passed"), ("http://a:1", "failed")]
    assert doc["served"][1]["server"] == {"export_sha256": SHA, "backend": "ort-int8"}
    save_served(_check("http://c:3", sha=OTHER), path, artifacts)  # -a named another export since
    assert [e["url"] for e in json.loads(path.read_text())["served"]] == ["http://c:3"]
    assert kept_served(path, SHA) == [] and len(kept_served(path, OTHER)) == 1


def test_the_table_names_the_server_and_a_failure_raises_one_line():
    check = _check("http://a:1", "failed", failures=("max_abs_diff: expected <= 0, got 0.02",))
    lines = format_served(check)
    assert lines[0] == (
        "server: http://a:1 (v2-http, model m) runs export aaaaaaaaaaaa; judged with the ort-int8 thresholds "
        "(said by the server)"
    )
    assert any(line.startswith("served      int8") and line.endswith("FAIL (int8 thresholds)") for line in lines)
    assert lines[-1] == "FAILED: the server's answers are not within the ort-int8 thresholds"
    with pytest.raises(ValidationError, match=r"^the server at http://a:1 \(v2-http\) failed: max_abs_diff"):
        check.raise_for_failures()
    refused = ServedCheck("http://a:1", "v2-http", "m", SHA, OTHER, "ort", "", "", status="refused", reason="refusing")
    assert format_served(refused)[0].endswith("runs export bbbbbbbbbbbb")  # no thresholds: nothing was judged
    with pytest.raises(OtherExportError, match="^refusing$"):
        refused.raise_for_failures()
