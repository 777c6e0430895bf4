"""Issue 10, themes 1 and 5: a re-export never leaves the folder without a complete export.

`kill -9` in the middle of a re-export leaves the previous export usable (its manifest verifies and
it predicts as before); the next successful export removes what the killed one left (staging
folder, temporaries of our naming), keeps the user's own files, and writes every artifact with one
file mode. A failed export (drift beyond thresholds) leaves the previous export in place too, with
the report and the rejected artifact beside it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bad_input import GOOD_IMAGES, cli_env, copy_export

from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.predictor import Predictor

pytestmark = pytest.mark.integration


def predictions(directory: Path) -> list[tuple[str, float]]:
    with Predictor.from_artifacts(directory, backend="ort") as p:
        return [(r.label, round(r.score, 5)) for r in p.predict([str(x) for x in GOOD_IMAGES])]


def staging_dirs(out: Path) -> list[Path]:
    return [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.vitdeploy-staging-")]


def test_kill_9_mid_reexport_keeps_the_previous_export_and_the_next_export_cleans_up(demo_artifacts, tmp_path):
    out = copy_export(demo_artifacts, tmp_path / "artifacts")
    out.chmod(0o750)
    before = predictions(out)
    (out / "NOTES.txt").write_text("mine")
    (out / "extra").mkdir()
    (out / "extra" / "data.csv").write_text("a,b\n")
    (out / ".model.onnx.ab12cd34.tmp").write_bytes(b"half an onnx")  # a killed atomic write of an older run
    (out / ".model.fp16.onnx.zz99yy88").mkdir()  # a killed ONNX staging folder

    proc = subprocess.Popen(
        [sys.executable, "-m", "vitdeploy.cli", "export", "-o", str(out), "--engine", "skip"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=cli_env(),
    )
    try:
        for line in proc.stderr:  # stage lines: "  onnx   ..." when the ONNX stage starts
            if re.match(r"^\s+onnx\s+\.\.\.", line):
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    assert staging_dirs(out), "the killed export was writing beside the folder, not into it"
    Artifacts.open(out)  # manifest valid, every file verifies
    assert predictions(out) == before

    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    result = run_export(parse_config({}, None), out, engine="skip")
    assert result.manifest_path == out / "manifest.json" and all(p.parent == out for p in result.artifacts.values())
    assert staging_dirs(out) == []
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "stale temporaries were removed"
    assert (out / "NOTES.txt").read_text() == "mine" and (out / "extra" / "data.csv").read_text() == "a,b\n"
    Artifacts.open(out)
    assert [label for label, _ in predictions(out)] == [label for label, _ in before]

    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir() if p.is_file() and p.name != "NOTES.txt"}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes  # model.safetensors was 0600
    assert oct(out.stat().st_mode & 0o777) == "0o750", "the folder keeps its mode through the swap"


def test_failed_reexport_keeps_the_previous_export_with_the_report_beside_it(demo_artifacts, tmp_path):
    out = copy_export(demo_artifacts, tmp_path / "artifacts")
    manifest_before = (out / "manifest.json").read_bytes()
    cfg = tmp_path / "strict.yaml"
    cfg.write_text(
        f"export: {{output_dir: {out}, fp16: {{enabled: false}}, optimize: false, "
        "batch: {max: 4, opt: 2}}\n"
        "validation: {noise_samples: 2, fp32: {max_abs_diff: 0, mean_abs_diff: 0, min_cosine: 1, min_top1_agreement: "
        "1, "
        "min_top5_overlap: 1}}\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "vitdeploy.cli", "export", "-c", str(cfg), "--engine", "skip"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
    )
    assert res.returncode == 3, res.stderr
    assert (out / "manifest.json").read_bytes() == manifest_before
    Artifacts.open(out)
    assert (out / "export-report.json").is_file() and (out / "model.onnx.rejected").is_file()
    assert f"full report: {out / 'export-report.json'}" in res.stderr
    assert staging_dirs(out) == []
