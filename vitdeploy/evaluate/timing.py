"""Interleaved timing for ``bench``: every iteration runs each backend once, the first one rotating.

A noisy machine (frequency scaling, a neighbour's job) then slows all backends alike and their
ratios hold. CPU work is timed with ``time.perf_counter``; work on a CUDA GPU with CUDA events.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping, Sequence


def interleaved(names: Sequence[str], iterations: int) -> Iterator[tuple[int, str]]:
    """(iteration, backend) in run order: every iteration runs each backend once, and the backend
    that goes first rotates (a, b, c; b, c, a; c, a, b; ...) so none always follows the same one."""
    names = list(names)
    for it in range(iterations):
        k = it % len(names) if names else 0
        for name in names[k:] + names[:k]:
            yield it, name


Timer = Callable[[Callable[[], Any]], float]


def wall_timer(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` took by ``time.perf_counter``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cuda_event_timer(device: str = "cuda") -> Timer:
    """A timer measuring ``fn()`` with CUDA events on ``device``'s current stream.

    The device is synchronised first so earlier work is not billed to this call; the end event is
    waited on before reading ``elapsed_time``. Every backend's ``run`` returns host numpy arrays,
    so the measured span covers the copies in and out and all the GPU work of the call.
    """
    from ..base._deps import require

    torch = require("torch", "timing CUDA backends with CUDA events")
    dev = torch.device(device)

    def timer(fn: Callable[[], Any]) -> float:
        with torch.cuda.device(dev):
            torch.cuda.synchronize(dev)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0  # elapsed_time is in milliseconds

    return timer


def measure(runners: Mapping[str, Callable[[], Any]], *, iterations: int, warmup: int,
            timers: Mapping[str, Timer] | None = None,
            on_error: Callable[[str, BaseException], None] | None = None) -> dict[str, list[float]]:
    """Warm up, then time every runner ``iterations`` times, interleaved (:func:`interleaved`).

    Returns seconds per call for each runner. A runner raising a VitDeployError is dropped from
    the remaining iterations and reported through ``on_error`` (else the error propagates).
    """
    from ..base.errors import VitDeployError

    timers = timers or {}
    alive = list(runners)
    times: dict[str, list[float]] = {name: [] for name in runners}

    def call(name: str, timed: bool) -> None:
        try:
            if timed:
                times[name].append((timers.get(name) or wall_timer)(runners[name]))
            else:
                runners[name]()
        except VitDeployError as exc:
            if on_error is None:
                raise
            on_error(name, exc)
            alive.remove(name)

    for _, name in interleaved(list(alive), warmup):
        if name in alive:
            call(name, False)
    for _, name in interleaved(list(alive), iterations):
        if name in alive:
            call(name, True)
    return times


__all__ = ["Timer", "cuda_event_timer", "interleaved", "measure", "wall_timer"]
