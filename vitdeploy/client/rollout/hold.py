"""A TEST-ONLY hook: hold a `vitdeploy rollout` at one of its phases, so that a test can kill it exactly there.

    VITDEPLOY_TEST_HOLD_ROLLOUT_AT=draining:/tmp/t/held.json vitdeploy rollout URL -a NEW ...

When the rollout reaches the phase it writes the marker file (JSON: the phase, its pid, the candidate's version and
the live one), then waits there - its lease renewed in the background, as during a slow step - until it is killed
(SIGKILL, Ctrl-C), at most :data:`HOLD_MAX_S`, then goes on. tests/client/test_rollout_crash.py kills it at each
phase under load and checks what the server answers and what the next rollout converges.

It cannot be reached by accident: nothing happens unless :data:`HOLD_ENV` is set; a rollout with it set says so
on its first line; a value that is not ``PHASE:MARKER`` (one of :data:`HOLD_POINTS`, an absolute path in a folder
that exists, no file there yet) is refused before anything is touched (exit 2), never ignored. Never set it on a
production machine. The hold points (driver.py):

* ``starting``: the candidate's application RUNNING on Ray Serve, the registry still says it is starting;
* ``shadow``: live requests being copied to it;
* ``promoting``: the phase recorded, the candidate at its replica count, unversioned requests not yet moved;
* ``draining``: unversioned requests moved (the candidate is live), the old version not yet removed;
* ``rolling-back``: the phase recorded, the candidate not yet removed.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ...base._files import write_json_atomic
from ...base.errors import ConfigError
from ...serve.rollout.registry import DRAINING, PROMOTING, ROLLING_BACK, SHADOW, STARTING

log = logging.getLogger(__name__)

HOLD_ENV = "VITDEPLOY_TEST_HOLD_ROLLOUT_AT"
HOLD_POINTS = (STARTING, SHADOW, PROMOTING, DRAINING, ROLLING_BACK)
HOLD_MAX_S = 600.0  # a hold left set by mistake delays a rollout, it never stops one for good
POLL_S = 0.05


@dataclass(frozen=True)
class Hold:
    """Where the rollout holds (``phase``) and the file it writes when it gets there (``marker``)."""

    phase: str
    marker: Path

    def line(self) -> str:
        return (
            f"TEST HOOK {HOLD_ENV} is set: this rollout holds at {self.phase} (writes {self.marker}); "
            "unset it outside vitdeploy's tests"
        )

    def reached(self, phase: str, max_s: float = HOLD_MAX_S, **details: Any) -> None:
        """At ``phase``: write the marker and wait (until killed, at most ``max_s``); elsewhere nothing."""
        if phase != self.phase:
            return
        write_json_atomic(self.marker, {"phase": phase, "pid": os.getpid(), **details})
        log.warning("test hook: held at %s (%s)", phase, HOLD_ENV)
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline:
            time.sleep(POLL_S)


def hold_from_env(environ: Optional[Mapping[str, str]] = None) -> Optional[Hold]:
    """The hold :data:`HOLD_ENV` asks for (None when it is unset); ConfigError when its value is not
    ``PHASE:MARKER`` as the module's docstring says."""
    value = (os.environ if environ is None else environ).get(HOLD_ENV)
    if value is None:
        return None
    phase, _, marker = value.partition(":")
    path = Path(marker)
    if phase not in HOLD_POINTS or not path.is_absolute() or not path.parent.is_dir() or path.exists():
        raise ConfigError(
            f"{HOLD_ENV}={value!r}: a test-only hook, PHASE:MARKER with PHASE one of {', '.join(HOLD_POINTS)} and "
            "MARKER an absolute path, not there yet, in a folder that exists; unset it outside vitdeploy's tests"
        )
    return Hold(phase, path)


def no_hold(phase: str, **details: Any) -> None:
    """What the driver calls at each hold point when no hold is asked: nothing."""


def hold_point(environ: Optional[Mapping[str, str]] = None, progress: Optional[Callable[[str], None]] = None):
    """The driver's hold point: :meth:`Hold.reached` when the hook is set (said to ``progress`` first), else
    :func:`no_hold`."""
    hold = hold_from_env(environ)
    if hold is None:
        return no_hold
    if progress is not None:
        progress(hold.line())
    return hold.reached


__all__ = ["HOLD_ENV", "HOLD_POINTS", "Hold", "hold_from_env", "hold_point", "no_hold"]
