"""What the CLI prints while work runs: the heartbeat, the stage lines, a path fitted to its column."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from vitdeploy.cli.console import Console, StageReporter
from vitdeploy.export.heartbeat import heartbeat


def _wait_until(condition, guard_s: float = 60.0) -> None:
    """Wait for ``condition`` (a hang guard only: no test here depends on how fast the machine is)."""
    deadline = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < deadline, "the heartbeat never came"
        time.sleep(0.005)


def test_heartbeat_beats_while_the_block_runs_and_never_after():
    beats: list[float] = []
    start = time.perf_counter()
    with heartbeat(lambda: beats.append(time.perf_counter() - start), every_s=0.02):
        _wait_until(lambda: len(beats) >= 5)  # the block lasts until it has beaten, however slow the machine
    ended = time.perf_counter() - start
    count = len(beats)
    time.sleep(0.1)  # five more periods in which a beat after the block would show
    assert len(beats) == count  # nothing after the block
    assert count >= 5 and all(b <= ended for b in beats), beats
    assert not [t for t in threading.enumerate() if t.name == "vitdeploy-heartbeat"]


def test_a_failing_beat_never_breaks_the_work_and_none_means_no_thread():
    def bad() -> None:
        raise RuntimeError("console gone")

    with heartbeat(bad, every_s=0.01):
        time.sleep(0.05)
    with heartbeat(bad, every_s=None):
        assert not [t for t in threading.enumerate() if t.name == "vitdeploy-heartbeat"]


def test_a_slow_stage_reports_running_with_elapsed_seconds_then_its_result(tmp_path):
    from vitdeploy.base.config import parse_config
    from vitdeploy.export.context import ExportContext

    seen: list[tuple[str, float]] = []
    export = ExportContext(
        parse_config({}, None),
        tmp_path,
        "skip",
        lambda rec: seen.append((rec.status, rec.seconds)),
        None,
        heartbeat_s=0.02,
    )
    with export.stage("slow"):
        _wait_until(lambda: len(seen) >= 6)  # running, then five beats
    assert seen[0] == ("running", 0.0) and seen[-1][0] == "passed"
    ticks = [s for status, s in seen[1:-1]]
    assert len(ticks) >= 5 and ticks == sorted(ticks) and 0 < ticks[0] < ticks[-1] <= seen[-1][1]
    assert all(status == "running" for status, _ in seen[1:-1])


def _rec(name: str, status: str, seconds: float, reason: str = "", outputs=()):
    return SimpleNamespace(name=name, status=status, seconds=seconds, reason=reason, outputs=list(outputs))


def test_stage_lines_off_a_terminal_print_every_few_seconds(capsys):
    report = StageReporter(Console(), plain_every_s=5.0)
    for secs in (0.0, 1.0, 2.0, 4.0, 5.0, 6.0, 10.5, 12.0):
        report(_rec("onnx", "running", secs))
    report(_rec("onnx", "passed", 12.3, "done"))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "  onnx                   ...",
        "  onnx                   ...     5s",
        "  onnx                   ...    10s",
        "  onnx                   passed      12.3s  done",
    ]


def test_a_running_stage_says_how_far_it_is_and_its_final_line_says_what_it_did(capsys):
    report = StageReporter(Console(), plain_every_s=5.0)
    running = _rec("validate-onnx", "running", 0.0)
    report(running)
    running.seconds, running.progress = 6.0, "32 of 64 inputs run"
    report(running)
    report(_rec("validate-onnx", "passed", 9.0, "64 inputs at batch 32"))
    lines = capsys.readouterr().err.splitlines()
    assert lines[1] == "  validate-onnx          ...     6s 32 of 64 inputs run"
    assert lines[2].endswith("9.0s  64 inputs at batch 32") and "of 64 inputs run" not in lines[2]


def test_on_a_terminal_the_status_line_is_rewritten_in_place_and_a_failure_carries_no_message(monkeypatch, capsys):
    monkeypatch.setattr(Console, "is_tty", staticmethod(lambda: True))
    console = Console()
    report = StageReporter(console)
    report(_rec("fp16", "running", 0.0))
    report(_rec("fp16", "running", 1.0))
    console.break_line()  # a log record arrives: it starts on its own line
    report(_rec("fp16", "running", 2.0))
    report(_rec("fp16", "failed", 2.5, "the reason, told by the error line"))
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "the reason" not in err
    assert err.endswith("\r\x1b[K  fp16                   failed       2.5s\n")
    assert "\r\x1b[K  fp16                   ...     1s\n" in err


@pytest.mark.parametrize(
    "path",
    [
        "/home/someone/a very long directory name for photos/from the summer holiday 2025/camera roll/one.png",
        "/data/photos/2025/08/12/IMG_20250812_142233_my_favourite_digit_three.png",
        "/d/" + "x" * 80 + ".jpeg",  # a file name longer than the column
        "short/name.jpg",
    ],
)
def test_fit_path_keeps_the_file_name_and_cuts_the_middle(path):
    from vitdeploy.cli.console import fit_path

    shown = fit_path(path, 48)
    assert len(shown) <= 48
    name = path.rsplit("/", 1)[1]
    if len(path) <= 48:
        assert shown == path
    elif len(name) < 40:
        assert shown.endswith("/" + name) and shown.startswith(path[:5]) and "…" in shown
        folders_kept = shown.split("…")[1].rsplit("/", 1)[0]
        assert folders_kept == "" or folders_kept.startswith("/")  # whole folder names after the cut
    else:
        assert shown.startswith(name[:10]) and shown.endswith(name[-10:])  # start and extension kept
