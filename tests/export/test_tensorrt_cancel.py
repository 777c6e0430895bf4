"""Ctrl-C during a TensorRT engine build: the export stops (KeyboardInterrupt, exit 130) and leaves
nothing half-written, on this machine's CPython (>= 3.11) with a real SIGINT.

The strict fake (tests/helpers/strict_tensorrt.py) calls the progress monitor through trampolines that
behave like pyCore.cpp's PyProgressMonitor (every exception caught, ``step_complete`` then False)
and, with ``sigint_at_step``, sends a real SIGINT to the main thread from C just before a callback,
as a Ctrl-C during TensorRT's C++ work arrives: Python handles it before the callback's first
line, where no ``try`` of ours can catch it. A test double for our logic, not TensorRT itself.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers.fresh_python import in_fresh_python
from helpers.strict_tensorrt import StrictTrt

import vitdeploy.export.tensorrt as trt_stage
from vitdeploy.base.errors import ExportError
from vitdeploy.export.engine_plan import plan_engine_build
from vitdeploy.export.tensorrt import build_engine
from vitdeploy.runtime.cuda import GpuIdentity

H100 = GpuIdentity(0, "NVIDIA H100 80GB HBM3", "9.0")


class NoCuda:
    cuda_version, torch_version = None, "2.13.0"

    @contextlib.contextmanager
    def device(self, index):
        yield


def build(plan, fake, **kwargs):
    return build_engine(plan, trt=fake, device_probe=lambda index: H100, cuda=NoCuda(), **kwargs)


@pytest.fixture
def plan(tmp_path: Path):
    onnx = tmp_path / "model.fp16.onnx"
    onnx.write_bytes(b"onnx")
    return plan_engine_build(
        onnx,
        tmp_path / "model.engine",
        chw=(3, 8, 8),
        min_batch=1,
        opt_batch=2,
        max_batch=4,
        workspace_mb=64,
        timing_cache_path=tmp_path / "timing.cache",
    )


_PREMISE = """
import functools, operator, signal, sys, threading

entered = []


def callback():
    try:
        entered.append(True)
    except KeyboardInterrupt:  # the point: never reached
        entered.append("caught inside")


kill = functools.partial(signal.pthread_kill, threading.main_thread().ident, signal.SIGINT)
try:
    list(map(operator.call, [kill, callback]))
except KeyboardInterrupt:
    print("raised", entered)
else:
    print("not raised", entered)
"""


def test_this_python_raises_a_pending_ctrl_c_before_a_callbacks_first_line():
    """The premise, on this interpreter: a SIGINT sent from C right before a Python callback is
    raised at the callback's first instruction, so the callback's own try never sees it. Shown in a
    Python of its own: a Ctrl-C that landed a bytecode later in the test runner's worker would stop the
    worker itself (pytest ends a session on KeyboardInterrupt), not fail this test."""
    import subprocess

    run = subprocess.run([sys.executable, "-c", _PREMISE], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "raised []" and sys.version_info >= (3, 11)


@in_fresh_python
def test_real_sigint_during_the_build_raises_keyboard_interrupt_after_it_and_writes_nothing(plan):
    fake = StrictTrt(build_steps=6, sigint_at_step=2)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="cancelled"):
        build(plan, fake)
    assert fake.steps_run == [0, 1, 2]  # the monitor cancelled at the step the Ctrl-C came
    assert fake.swallowed == []  # nothing was lost in TensorRT's trampolines
    assert signal.getsignal(signal.SIGINT) is before  # the user's handler is back
    assert sorted(p.name for p in plan.onnx_path.parent.iterdir()) == [
        "model.fp16.onnx"
    ]  # no engine, json, temp or cache


@in_fresh_python
def test_without_the_sigint_handler_the_same_ctrl_c_is_lost(plan, monkeypatch):
    """What the handler prevents: the fake reproduces the loss the trampolines cause."""
    monkeypatch.setattr(trt_stage, "_ctrl_c_cancels", contextlib.nullcontext)
    fake = StrictTrt(build_steps=6, sigint_at_step=2)
    with pytest.raises(ExportError, match="failed to build"):
        build(plan, fake)
    assert [type(e) for e in fake.swallowed] == [KeyboardInterrupt]


def test_handler_restored_when_the_build_fails(plan):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(ExportError, match="could not parse"):
        build(plan, StrictTrt(parse_errors=("bad node",)))
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
@in_fresh_python
def test_cli_export_interrupted_during_the_engine_build_exits_130_leaving_no_artifact(tmp_path, monkeypatch):
    from vitdeploy.cli import main
    from vitdeploy.demo import DEMO_DIR

    fake = StrictTrt(build_steps=4, sigint_at_step=1)
    monkeypatch.setattr(trt_stage, "tensorrt_unavailable_reason", lambda device: None)
    monkeypatch.setattr(
        trt_stage,
        "build_engine",
        functools.partial(build_engine, trt=fake, device_probe=lambda i: H100, cuda=NoCuda()),
    )
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"checkpoint": str(DEMO_DIR)},
                "export": {"batch": {"max": 4, "opt": 2}},
                "validation": {"noise_samples": 2},
            }
        )
    )
    out = tmp_path / "out"
    # --engine auto (the default) turns a failed build into a warning; a Ctrl-C must still stop the export
    res = CliRunner().invoke(main, ["export", "-c", str(cfg), "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 130, res.output
    assert "interrupted" in res.stderr and "Traceback" not in res.output + res.stderr
    assert fake.steps_run == [0, 1]
    assert sorted(p.name for p in out.iterdir()) == ["export-report.json"]  # the staged artifacts were dropped
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]
