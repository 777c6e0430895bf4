"""Every error a command meets, mapped once, for every command the `vitdeploy` group holds.

A VitDeployError becomes one line on stderr (``error: ...``) and its exit code (2 usage/config, 3 validation
failed, 4 required stage unavailable, 1 other); Ctrl-C one line and 130; a write that fails for the
machine's sake (the disk full, a file over the size limit) one line and WriteError's code. A user never
sees a traceback for their own mistake: ``VITDEPLOY_DEBUG=1`` shows it.

The mapping lives in :class:`ErrorMappingGroup`, the class of the `vitdeploy` group: whichever module
defines a command, it runs inside the group's ``invoke``, so no command can be registered without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from ..base.errors import VitDeployError, WriteError, first_line
from .console import CONSOLE

MAX_ERROR_LINE = 2000  # values inside a message are already cut at 200; the last guard against a hostile file


def _fail(message: str, code: int) -> NoReturn:
    CONSOLE.line(f"error: {message}")
    sys.exit(code)


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Run the block; its VitDeployError, Ctrl-C or failed write ends the process with one line and a code."""
    try:
        yield
    except VitDeployError as exc:
        if os.environ.get("VITDEPLOY_DEBUG"):
            raise
        _fail(first_line(exc, MAX_ERROR_LINE), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted; no partial artifact was left under a final name", 130)
    except OSError as exc:  # the disk full, a file over the size limit: the machine's fault, one line
        if exc.errno not in WriteError.ERRNOS or os.environ.get("VITDEPLOY_DEBUG"):
            raise
        _fail(first_line(WriteError.from_os(exc), MAX_ERROR_LINE), WriteError.exit_code)


class ErrorMappingGroup(click.Group):
    """A click group whose commands (and its sub-groups' commands) all run inside :func:`mapped_errors`."""

    def invoke(self, ctx: click.Context) -> Any:
        with mapped_errors():
            return super().invoke(ctx)
