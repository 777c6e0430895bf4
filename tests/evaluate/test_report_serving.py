"""The report's "Serving settings" section: what `vitdeploy tune` measured (tune-report.json), or how to measure it."""

from __future__ import annotations

import json
import shutil

from vitdeploy.evaluate.report.facts import gather
from vitdeploy.evaluate.report.serving import serving_section

TRIAL = {
    "settings": "ort, 2 replica(s) x 1 CPU, 1 call(s), batch 4 within 5 ms, 1 decode thread(s)",
    "backend": "ort",
    "replicas": 2,
    "cpus_per_replica": 1,
    "concurrent_batches": 1,
    "max_batch_size": 4,
    "batch_wait_timeout_s": 0.005,
    "decode_threads": 1,
}


def test_the_section_shows_the_tuned_settings_and_their_figures(tiny_artifacts, tmp_path):
    export = tmp_path / "export"
    shutil.copytree(tiny_artifacts(), export)
    assert "vitdeploy tune -a" in serving_section(gather(export))  # not tuned yet: the command that does it
    best = {**TRIAL, "throughput_rps": 123.4, "p50_ms": 20.5, "p99_ms": 31.0, "clients": 8, "how": "in place"}
    slow = {**TRIAL, "settings": "ort, 1 replica(s) x 2 CPU", "throughput_rps": 99.0, "p99_ms": 40.0, "how": "started"}
    report = {
        "format": "vitdeploy-tune",
        "best": best,
        "default": slow,
        "gain_over_default": 1.2465,
        "objective": "the highest throughput whose p99 <= 50 ms",
        "trials": [slow, best],
        "seconds": 90,
        "cores": 2,
        "stopped": "done",
        "overlay": "tuned.yaml",
    }
    (export / "tune-report.json").write_text(json.dumps({**report, "target": "serve"}))
    html = serving_section(gather(export))
    assert "ort, 2 replica(s) x 1 CPU, 1 call(s), batch 4 within 5 ms, 1 decode thread(s)" in html
    assert "123.4 requests/s" in html and "1.25x the settings it started from (99.0 requests/s)" in html
    assert "p99 &lt;= 50 ms" in html and html.index("123.4") < html.index("<td>99.0</td>")  # fastest first


def test_a_report_of_a_triton_tune_or_a_hand_edited_one_still_renders(tiny_artifacts, tmp_path):
    export = tmp_path / "export"
    shutil.copytree(tiny_artifacts(), export)
    best = {"settings": "2 instance(s) x 1 thread(s), 2 preprocess, queue delay 1000 us", "throughput_rps": 585.3}
    (export / "tune-report.json").write_text(json.dumps({"target": "triton", "best": best, "trials": [best, {}]}))
    html = serving_section(gather(export))
    assert "2 instance(s) x 1 thread(s)" in html and "vitdeploy triton-repo -c" in html and "Target: triton" in html
