"""Interleaved timing for ``bench``: every iteration runs each backend once, the first one rotating.

A noisy machine (frequency scaling, a neighbour's job) then slows all backends alike and their
ratios hold. CPU work is timed with ``time.perf_counter``; work on a CUDA GPU with CUDA events.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
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


def measure(
    runners: Mapping[str, Callable[[], Any]],
    *,
    iterations: int,
    warmup: int,
    timers: Mapping[str, Timer] | None = None,
    on_error: Callable[[str, BaseException], None] | None = None,
) -> dict[str, list[float]]:
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


# ------------------------------------------------------------------------------------------------
# statistics


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default "linear" method): rank ``q / 100 * (n - 1)`` of the sorted samples."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(float(v) for v in samples)
    rank = q / 100.0 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass(frozen=True)
class LatencyStats:
    """Latency of one call (one batch) in milliseconds, and the throughput it implies."""

    samples: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    images_per_s: float  # batch_size * samples / total time

    @property
    def spread(self) -> float:
        """p90 / p50: 1.0 for a steady figure; contention (threads descheduled) makes it grow."""
        return self.p90_ms / self.p50_ms if self.p50_ms > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "p90_over_p50": round(self.spread, 3)}


def summarize(seconds: Sequence[float], batch_size: int) -> LatencyStats:
    """Statistics of per-call latencies ``seconds`` for calls of ``batch_size`` images each."""
    if not seconds:
        raise ValueError("no timings to summarise")
    ms = [1000.0 * s for s in seconds]
    total = float(sum(seconds))
    return LatencyStats(
        samples=len(ms),
        p50_ms=percentile(ms, 50),
        p90_ms=percentile(ms, 90),
        p99_ms=percentile(ms, 99),
        mean_ms=total * 1000.0 / len(ms),
        min_ms=min(ms),
        images_per_s=batch_size * len(ms) / total if total > 0 else float("inf"),
    )


def speed_ratio(baseline_p50_ms: float | None, p50_ms: float | None) -> float | None:
    """How many times faster than the baseline (baseline p50 / this p50); None when unknown."""
    if not baseline_p50_ms or not p50_ms or p50_ms <= 0:
        return None
    return baseline_p50_ms / p50_ms


# ------------------------------------------------------------------------------------------------
# environment


__all__ = [
    "BenchResult",
    "LatencyStats",
    "Timer",
    "cuda_event_timer",
    "interleaved",
    "measure",
    "percentile",
    "speed_ratio",
    "summarize",
    "wall_timer",
]


@dataclass
class BenchResult:
    """One timed figure of `vitdeploy bench`: a backend at a batch size, its ratio to eager PyTorch and
    why that ratio cannot be trusted (evaluate/reliability.py fills ``unreliable``)."""

    backend: str
    batch_size: int
    stats: LatencyStats
    timer: str  # "perf_counter" | "cuda-events"
    speedup: float | None = None  # eager torch CPU p50 / this p50
    phases_ms: dict[str, float] | None = None  # end-to-end: mean ms per phase
    phase_share: dict[str, float] | None = None  # end-to-end: fraction of the total per phase
    unreliable: list[str] = field(default_factory=list)  # why the ratio cannot be trusted (empty: it can)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "backend": self.backend,
            "batch_size": self.batch_size,
            **self.stats.to_dict(),
            "timer": self.timer,
            "speedup_vs_torch_cpu": self.speedup,
            "speedup_unreliable": self.unreliable,
        }
        if self.phases_ms is not None:
            out["phases_ms"] = self.phases_ms
            out["phase_share"] = self.phase_share
        return out
