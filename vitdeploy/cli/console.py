"""What the CLI writes on stderr while work runs: a status line, export stages as they progress.

On a terminal a running stage is one line rewritten in place every second (``onnx ... 12s``);
elsewhere (a log file, CI) a line is printed when the stage starts and then every few seconds,
so a long stage is never silent. Log records printed meanwhile start on a line of their own.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

import click

from ..base.memory import human

STAGE_WIDTH = 22  # the longest stage name, "validate-ort-optimized"
_ERASE = "\r\x1b[K"  # back to the line's start, clear it


class Console:
    """stderr, with at most one pending status line (written without a newline on a terminal)."""

    def __init__(self) -> None:
        self._pending = False
        self._lock = threading.RLock()

    @staticmethod
    def is_tty() -> bool:
        return sys.stderr.isatty()

    def status(self, text: str) -> None:
        """Show ``text`` as the current status: in place on a terminal, else as a line."""
        with self._lock:
            if self.is_tty():
                click.echo(_ERASE + text, err=True, nl=False, color=True)
                self._pending = True
            else:
                click.echo(text, err=True)

    def line(self, text: str) -> None:
        """A finished line; it replaces the pending status line."""
        with self._lock:
            if self._pending:
                click.echo(_ERASE, err=True, nl=False, color=True)
                self._pending = False
            click.echo(text, err=True)

    def break_line(self) -> None:
        """End the pending status line so what is written next starts on a line of its own."""
        with self._lock:
            if self._pending:
                click.echo("", err=True)
                self._pending = False


#: The one console of a `vitdeploy` run: its log records, its export stages and its ``error:`` line share it.
CONSOLE = Console()


class ConsoleLogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stderr log handler that first ends the console's pending status line."""

    def __init__(self, console: Console) -> None:
        super().__init__(sys.stderr)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.break_line()
        super().emit(record)


class StageReporter:
    """The ``on_stage`` callback of :func:`vitdeploy.export.pipeline.run_export`, printing:

        onnx                   ...     12s                  (while it runs)
        onnx                   passed    16.0s  model.onnx 758.3 KB

    A failed stage's line carries no message: the error that stopped it is printed once, as the
    command's ``error:`` line."""

    def __init__(self, console: Console, plain_every_s: float = 5.0) -> None:
        self.console = console
        self.plain_every_s = plain_every_s
        self._shown: dict[str, float] = {}  # stage -> elapsed seconds last printed (not a terminal)

    def __call__(self, rec: Any) -> None:
        if rec.status == "running":
            last = self._shown.get(rec.name)
            if self.console.is_tty() or last is None or rec.seconds - last >= self.plain_every_s:
                self._shown[rec.name] = rec.seconds
                elapsed = f"{rec.seconds:5.0f}s" if rec.seconds else ""
                doing = getattr(rec, "progress", "") or rec.reason or ""
                self.console.status(f"  {rec.name:<{STAGE_WIDTH}} ... {elapsed} {doing}".rstrip())
            return
        detail = ""
        if rec.status != "failed":
            sizes = ", ".join(f"{p.name} {file_size(p)}" for p in rec.outputs if p.exists())
            peak = f"[peak {human(rec.peak_rss)}]" if getattr(rec, "peak_rss", None) else ""
            detail = " ".join(x for x in (sizes, rec.reason, peak) if x)
        self.console.line(f"  {rec.name:<{STAGE_WIDTH}} {rec.status:<8} {rec.seconds:7.1f}s  {detail}".rstrip())
        for line in getattr(rec, "details", ()):  # e.g. the model stage: what was understood, and from where
            self.console.line(f"    {line}")


def file_size(path: Path) -> str:
    return human(path.stat().st_size)


def fit_path(path: str, width: int) -> str:
    """``path`` in at most ``width`` characters: whole when it fits, else cut in the middle of its
    folders so that the file name stays whole (``/data/photos/su…/holiday/IMG_0001.jpg``); a file name
    longer than the column is itself cut in the middle, keeping its start and its extension."""
    if len(path) <= width:
        return path
    budget = width - 1  # one character for the ellipsis
    name = path.rpartition(os.sep)[2]
    if len(name) + 1 <= budget - 4:  # room for the separator and a few characters of the folders
        tail = path[-max(len(name) + 1, budget // 2) :]
        tail = tail[tail.index(os.sep) :]  # whole folder names only
        return path[: budget - len(tail)] + "…" + tail
    keep = budget // 2
    return name[:keep] + "…" + name[-(budget - keep) :]


def refresh_report(artifacts_dir: Path, always: bool = False) -> str | None:
    """Write (``always``) or refresh (when one exists) the export's report.html; its path, or None.
    A report is never worth failing the command for: without matplotlib (the [report] extra) it says so."""
    from ..base.errors import MissingDependencyError, VitDeployError, first_line
    from ..evaluate.report import REPORT_NAME, write_report

    if not always and not (Path(artifacts_dir) / REPORT_NAME).is_file():
        return None
    try:
        path, _, _ = write_report(artifacts_dir)
    except MissingDependencyError as exc:
        click.echo(f"report not written: {first_line(exc)}", err=True)
        return None
    except (VitDeployError, OSError) as exc:
        click.echo(f"report not written: {first_line(exc)}", err=True)
        return None
    return str(path)
