"""A heartbeat: call a function every few seconds from a background thread while a block runs.

    with heartbeat(lambda: report(elapsed()), every_s=1.0):
        slow_work()

Long work in a library reports progress through a callback and leaves the console to its caller;
this is how a stage that runs for minutes (an ONNX export of a large model) still says every
second that it is alive. The function is never called after the block ends, and an exception it
raises is logged and ignored: a heartbeat never breaks the work it reports on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable, Iterator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def heartbeat(beat: Callable[[], None], every_s: float | None) -> Iterator[None]:
    """Call ``beat()`` every ``every_s`` seconds while the block runs (never when ``every_s`` is
    None or <= 0). The thread is stopped and joined before the block's exit goes on."""
    if not every_s or every_s <= 0:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            try:
                beat()
            except Exception:  # noqa: BLE001 - progress reporting must never break the work
                log.debug("heartbeat callback failed", exc_info=True)

    thread = threading.Thread(target=loop, name="vitdeploy-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
