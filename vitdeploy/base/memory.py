"""This process's memory as the kernel counts it: resident now, the peak since a reset, and what the
machine still has available (Linux /proc; elsewhere None: callers then say nothing about memory).

The peak is the kernel's own high-water mark (``VmHWM``), reset by writing ``5`` to
``/proc/self/clear_refs``: it sees every allocation of the process, ONNX Runtime's arenas and
protobuf's copies included, which Python's tracemalloc does not.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Iterator


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes() -> int | None:
    """Resident memory of this process now."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes() -> int | None:
    """The highest resident memory of this process since the last :func:`reset_peak` (or its start)."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak() -> bool:
    """Start a new peak from the current resident memory; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def give_back() -> None:
    """Return freed memory to the system: Python's garbage first, then glibc's free lists (``malloc_trim``;
    ONNX Runtime sessions and protobuf copies that were freed stay resident without it)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


#: Whether a :func:`heap_frozen` block froze the heap (and so may unfreeze it): the collector's permanent
#: generation is one for the whole process, and ``gc.unfreeze`` empties all of it.
_frozen_by_us = False
_freeze_lock = threading.Lock()


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Leave what the process held before the block out of every garbage collection inside it
    (``gc.freeze``): the libraries already imported are never garbage, and walking their millions of
    objects made each :func:`give_back` cost a third of a second (17 of them per export). What the block
    creates is collected as before; the frozen objects rejoin the collector when it ends.

    Only a heap nobody froze is frozen, and only what this block froze is unfrozen: where the host process
    froze its own heap (a pre-fork server's ``gc.freeze()``), or another block already froze it (an export
    inside an export, two in threads), the block freezes nothing and unfreezes nothing (``gc.unfreeze`` is
    global: it would hand the host's frozen objects back to the collector)."""
    import gc

    global _frozen_by_us
    with _freeze_lock:
        ours = gc.get_freeze_count() == 0
        if ours:
            gc.freeze()
            _frozen_by_us = True
    try:
        yield
    finally:
        if ours:
            with _freeze_lock:
                _frozen_by_us = False
                gc.unfreeze()


def refreeze() -> None:
    """Inside :func:`heap_frozen`: collect what is garbage now, then freeze what is left too (after a step
    that imported large libraries; what is alive now must not be freed later by the cycle collector alone).
    Where the block froze nothing (the heap was the host's to freeze), only the collection."""
    import gc

    give_back()
    with _freeze_lock:
        if _frozen_by_us:
            gc.freeze()


def available_bytes() -> int | None:
    """Memory the machine can still give without swapping (``MemAvailable``)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def human(n: float | None) -> str:
    """``1.2 GB``-style size (binary units, as ``ls -h``)."""
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


__all__ = [
    "available_bytes",
    "give_back",
    "heap_frozen",
    "human",
    "refreeze",
    "peak_rss_bytes",
    "reset_peak",
    "rss_bytes",
]
