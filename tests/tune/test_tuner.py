"""`vitdeploy tune` for real, on the demo export: a search cut at --trials writes an overlay that `config check`
accepts and `serve -c` starts with; Ctrl-C stops it cleanly (the best so far written, no process left behind); a
backend that failed validation is refused by name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "ray.serve", reason="vitdeploy tune --target serve needs ray[serve] (pip install 'vitdeploy[serve]')"
)

from click.testing import CliRunner  # noqa: E402
from helpers.held import processes  # noqa: E402
from helpers.serve_process import ServeProcess, serve_env  # noqa: E402

from vitdeploy.client.loadtest import LoadPlan, load_images, run_loadtest  # noqa: E402
from vitdeploy.client.protocols import PREDICT, Target  # noqa: E402
from vitdeploy.serve.triton.local import free_port  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# a p99 goal every setting meets on any machine: the tests check what tune writes, not this machine's jitter
# (the default objective, p99 within 2x its p50, was missed by every setting on a loaded machine: exit 3)
SLO = "60000"
# a search whose length does not depend on the machine's speed: cut after --trials, never by the budget
SHORT = ["--budget", "10m", "--slo-p99-ms", SLO, "--trials"]


def _tune(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vitdeploy.cli", "tune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**serve_env(), **(env or {})},
    )


def test_a_short_search_writes_an_overlay_that_config_check_accepts_and_serve_starts_with(demo_artifacts, tmp_path):
    from vitdeploy.cli import main

    artifacts = tmp_path / "export"
    shutil.copytree(demo_artifacts, artifacts)
    overlay = tmp_path / "tuned.yaml"
    proc = _tune(["-a", str(artifacts), "-b", "ort", *SHORT, "1", "-o", str(overlay)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "[1] ort, " in err and "[2] " not in err and f"wrote {overlay}" in err
    text = overlay.read_text()
    assert "# 1 candidate in" in text and "stopped at --trials" in text
    assert text.startswith("# vitdeploy tune --target serve") and "\nserve:\n  replicas: " in text
    check = CliRunner().invoke(main, ["config", "check", "-c", str(overlay)])
    assert check.exit_code == 0, check.output
    report = json.loads((artifacts / "tune-report.json").read_text())
    assert report["format"] == "vitdeploy-tune" and report["best"]["backend"] == "ort" and report["trials"]
    # serve -c tuned.yaml as it is (its own metrics port added: tests run side by side)
    overlay.write_text(text + f"  metrics_port: {free_port()}\n")
    server = ServeProcess(artifacts, overlay)
    try:
        plan = LoadPlan(Target(server.url, PREDICT), load_images(None), concurrency=(2,), requests=6, warmup_s=0)
        assert run_loadtest(plan).levels[0].ok == 6
    finally:
        server.stop()


def test_ctrl_c_stops_the_server_writes_the_best_so_far_and_leaves_no_process(demo_artifacts, tmp_path):
    overlay = tmp_path / "tuned.yaml"
    proc = _tune(["-a", str(demo_artifacts), "-b", "ort", "--budget", "10m", "-o", str(overlay)])
    lines: list[str] = []
    measured = threading.Event()

    def pump() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("[1] "):
                measured.set()

    threading.Thread(target=pump, daemon=True).start()
    assert measured.wait(240), "".join(lines[-30:])
    children = set(processes("", root=proc.pid))  # Ray's processes, the replicas among them
    assert any(processes("ServeReplica:", root=proc.pid))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 130, "".join(lines[-30:])
    assert overlay.is_file() and "stopped by Ctrl-C" in overlay.read_text()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in children):
        time.sleep(0.5)
    alive = [pid for pid in children if os.path.exists(f"/proc/{pid}") and not _zombie(pid)]
    assert not alive, [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in alive]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_a_backend_that_failed_validation_is_refused_by_name(demo_artifacts, tmp_path):
    from vitdeploy.cli import main

    artifacts = tmp_path / "export"
    shutil.copytree(demo_artifacts, artifacts)
    drift = {"backends": [{"name": "torch", "status": "reference"}, {"name": "ort", "status": "failed"}]}
    (artifacts / "drift-report.json").write_text(json.dumps(drift))
    result = CliRunner().invoke(main, ["tune", "-a", str(artifacts), "-b", "ort", "--budget", "5s"])
    assert result.exit_code == 2, result.output
    assert "backend ort did not pass validation" in result.output and "torch" in result.output


def test_the_triton_target_reloads_the_models_in_place_and_its_overlay_builds_a_repository(demo_artifacts, tmp_path):
    from vitdeploy.cli import main
    from vitdeploy.serve.triton.local import default_venv

    if not (default_venv() / "bin" / "python").exists():
        reason = f"no {default_venv()} (make triton-env): the bundled tritonserver is not installed"
        pytest.fail(reason) if os.environ.get("CI", "").lower() == "true" else pytest.skip(reason)
    artifacts = tmp_path / "export"
    shutil.copytree(demo_artifacts, artifacts)
    overlay = tmp_path / "tuned.yaml"
    proc = _tune(["--target", "triton", "-a", str(artifacts), *SHORT, "2", "-o", str(overlay)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    trials = json.loads((artifacts / "tune-report.json").read_text())["trials"]
    assert [t["how"] for t in trials] == ["started", "models reloaded"]
    assert "\ntriton:\n  inference: ort_python" in overlay.read_text() and "\n  instances: " in overlay.read_text()
    built = CliRunner().invoke(
        main, ["triton-repo", "-a", str(artifacts), "-o", str(tmp_path / "repo"), "-c", str(overlay)]
    )
    assert built.exit_code == 0, built.output
    config = (tmp_path / "repo" / "vit-demo-digits_ort_python" / "config.pbtxt").read_text()
    best = json.loads((artifacts / "tune-report.json").read_text())["best"]
    assert f"max_queue_delay_microseconds: {best['max_queue_delay_us']}" in config
    assert not processes("tritonserver", root=os.getpid())  # none left behind


def test_a_tritonserver_on_path_is_tuned_when_none_is_bundled(demo_artifacts, tmp_path):
    """No bundled server (VITDEPLOY_TRITON_VENV names none): tune runs the `tritonserver` found on PATH. That one is
    the bundled binary behind a wrapper that gives it its backends and libraries, as an installation would: a real
    server reached through the PATH code path."""
    from vitdeploy.serve.triton.local import BundledTriton, default_venv

    if not (default_venv() / "bin" / "python").exists():
        reason = f"no {default_venv()} (make triton-env): no tritonserver binary to put on PATH"
        pytest.fail(reason) if os.environ.get("CI", "").lower() == "true" else pytest.skip(reason)
    bundled = BundledTriton(default_venv(), tmp_path)
    cmd, env = bundled._prepare()  # the binary, its backend directory, its libraries and the stub's Python
    try:
        wrapper = tmp_path / "bin" / "tritonserver"
        wrapper.parent.mkdir()
        exports = "".join(f"export {k}='{env[k]}'\n" for k in ("LD_LIBRARY_PATH", "PATH"))
        wrapper.write_text(f"#!/bin/sh\n{exports}exec '{cmd[0]}' '{cmd[1]}' \"$@\"\n")
        wrapper.chmod(0o755)
        overlay = tmp_path / "tuned.yaml"
        path = f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}"
        proc = _tune(
            ["--target", "triton", "-a", str(demo_artifacts), *SHORT, "1", "-o", str(overlay)],
            env={"VITDEPLOY_TRITON_VENV": str(tmp_path / "none"), "PATH": path},
        )
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert "[1] " in err and overlay.is_file()
    finally:
        bundled.stop()
    assert not processes("tritonserver", root=os.getpid())
