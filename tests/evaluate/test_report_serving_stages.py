"""The serving section's "Where a request's time goes" (evaluate/report/serving_stages.py): per load level of a
saved `vitdeploy loadtest -a` result or of tune's best settings, the server's own stage split (Server-Timing) as
stacked bars and a table beside the client's p50/p99; one line where the server sent no split."""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")

from vitdeploy.client.loadgen import LevelResult  # noqa: E402
from vitdeploy.client.loadtest import LoadReport, save_loadtest  # noqa: E402
from vitdeploy.evaluate.report.facts import gather  # noqa: E402
from vitdeploy.evaluate.report.serving import serving_section  # noqa: E402
from vitdeploy.evaluate.report.serving_stages import NO_SPLIT, OUTSIDE, loadtest_levels, split_figure  # noqa: E402
from vitdeploy.tune.measure import Figure  # noqa: E402

#: what `loadtest` averaged from the headers at one client and at eight (where the batch queue took the time)
ALONE = {
    "read": 0.2,
    "decode": 2.5,
    "queue": 1.0,
    "model": 5.0,
    "post": 0.2,
    "total": 9.0,
    "batch": 1.0,
    "requests": 4,
}
QUEUED = {"read": 0.3, "decode": 3.0, "queue": 25.0, "model": 12.0, "post": 0.3, "total": 40.7, "batch": 6.3}
TARGET = {"url": "http://127.0.0.1:8000", "protocol": "predict", "model": None, "token": False}


def _level(clients: int, latencies: list[float], stages: dict | None = None) -> LevelResult:
    level = LevelResult("concurrency", clients, 2.0, list(latencies), Counter({"200": len(latencies)}))
    level.stages = dict(stages or {})
    return level


def _export(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": "synthetic", "artifacts": {}, "validation": {}}))
    return folder


def _rows(section: str) -> list[list[str]]:
    table = section[section.index("<table class='stages'>") :]
    body = table[table.index("<tbody>") : table.index("</tbody>")]
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)] for row in body.split("</tr>")[:-1]]


def test_a_saved_loadtest_shows_each_levels_stage_split_beside_the_clients_percentiles(tmp_path):
    levels = [_level(1, [10, 11, 12, 30], ALONE), _level(8, [40, 45, 50, 90], QUEUED)]
    export = _export(tmp_path / "export")
    assert save_loadtest(LoadReport(TARGET, levels), export) == export / "loadtest-report.json"
    section = serving_section(gather(export))
    assert "vitdeploy loadtest of http://127.0.0.1:8000 (predict, " in section and "<svg" in section
    eight = levels[1]
    share = f"{100 * 40.7 / eight.mean_ms:.0f}%"
    assert _rows(section)[1] == [
        "8 clients",
        f"{eight.throughput:.1f}",
        f"{eight.percentile(50):.2f}",
        f"{eight.percentile(99):.2f}",
        *("0.30", "3.00", "25.00", "12.00", "0.30", "40.70", "6.3", share),
    ]
    assert _rows(section)[0][:5] == ["1 client", "2.0", "11.50", f"{levels[0].percentile(99):.2f}", "0.20"]
    # the bars: each stage's mean stacked, then what the replica does not account for; the client's p50 and p99
    doc = json.loads((export / "loadtest-report.json").read_text())
    ax = split_figure(loadtest_levels(doc)).axes[0]
    bars = {c.get_label(): [round(p.get_height(), 3) for p in c.patches] for c in ax.containers}
    assert bars["batch queue"] == [1.0, 25.0] and bars["model call"] == [5.0, 12.0]
    assert bars[OUTSIDE] == [round(lv.mean_ms - lv.stages["total"], 3) for lv in levels]
    marks = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert marks["client p99"] == pytest.approx([lv.percentile(99) for lv in levels], abs=1e-3)
    assert "batch 6.3" in [t.get_text().split("\n")[-1] for t in ax.get_xticklabels()]


def test_tunes_best_settings_show_the_split_of_each_level_it_measured_them_at(tmp_path):
    export = _export(tmp_path / "export")
    figure = Figure(levels=[_level(4, [20, 22, 24, 60], QUEUED)]).to_dict()
    best = {"settings": "ort, 1 replica(s)", **figure}
    (export / "tune-report.json").write_text(json.dumps({"target": "serve", "best": best, "trials": [best]}))
    section = serving_section(gather(export))
    assert "vitdeploy tune: the best settings at each load measured" in section
    assert _rows(section)[0][:2] == ["4 clients", f"{figure['levels'][0]['rps']:.1f}"]
    assert _rows(section)[0][4:11] == ["0.30", "3.00", "25.00", "12.00", "0.30", "40.70", "6.3"]


def test_results_without_a_stage_split_say_so_in_one_line(tmp_path):
    export = _export(tmp_path / "export")
    assert "vitdeploy loadtest URL -a" in serving_section(gather(export))  # nothing ran: the command that does it
    save_loadtest(LoadReport(TARGET, [_level(1, [10, 12]), _level(4, [20, 30])]), export)  # Triton, stage_timing off
    old_tune = {"best": {"settings": "ort", "levels": [{"clients": 2, "rps": 80.0, "p99_ms": 30.0}]}}
    (export / "tune-report.json").write_text(json.dumps({"target": "serve", **old_tune, "trials": []}))
    section = serving_section(gather(export))
    stages = section[section.index("<h3 id='stages'>") :]
    lines = [html.unescape(line) for line in re.findall(r"<p class='nosplit'>(.*?)</p>", stages)]
    assert [line.endswith(f": {NO_SPLIT}.") for line in lines] == [True, True]
    assert lines[0].startswith("vitdeploy tune: ") and lines[1].startswith("vitdeploy loadtest of http://127.0.0.1")
    assert "<svg" not in stages and "<table" not in stages
    hand_edited = {"target": "x", "levels": ["x", {"latency_ms": "fast", "server_timing_ms": {"queue": "slow"}}]}
    (export / "loadtest-report.json").write_text(json.dumps(hand_edited))
    assert NO_SPLIT in html.unescape(serving_section(gather(export)))  # never an error
