"""One candidate's figure: load levels up to saturation, and the best throughput a latency goal allows.

Closed loop from a client count that can fill the candidate's batches (half its replicas x concurrent calls x
batch size), doubling until the throughput stops growing (under 5 % more than the best so far) or the goal is
missed, or halving while the goal is missed; each level is kept. The objective:

* with an SLO (``slo_p99_ms``): the highest throughput of a level whose p99 meets it;
* without: the highest throughput of a level whose p99 is within 2x its p50 (a queue that is not running away), or
  within 5 ms of it (a few milliseconds of scheduling jitter decide the ratio of a fast model's latencies).

A level with errors never counts. Two figures compare by that throughput; where neither candidate has an
acceptable level, the lower p99 wins (it is closer to acceptable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ..client.loadgen import LevelResult, closed_loop
from ..client.protocols import Target, open_client

SATURATED = 1.05  # a level must add this much throughput over the best so far, or the ramp stops
MAX_CLIENTS = 64
P99_OVER_P50 = 2.0
#: a p99 this close to its p50 is accepted whatever the ratio: below it, scheduling jitter decides the ratio
JITTER_MS = 5.0


@dataclass
class Figure:
    """A candidate's measured levels and what the objective takes from them."""

    levels: list[LevelResult] = field(default_factory=list)
    slo_p99_ms: Optional[float] = None
    seconds: float = 0.0
    complete: bool = True  # False: the budget ran out during the measurement

    def acceptable(self, level: LevelResult) -> bool:
        if level.errors or not level.latencies_ms:
            return False
        p99 = level.percentile(99)
        if self.slo_p99_ms is not None:
            return p99 <= self.slo_p99_ms
        p50 = level.percentile(50)
        return p99 <= max(P99_OVER_P50 * p50, p50 + JITTER_MS)

    @property
    def best(self) -> Optional[LevelResult]:
        ok = [lv for lv in self.levels if self.acceptable(lv)]
        return max(ok, key=lambda lv: lv.throughput) if ok else None

    @property
    def throughput(self) -> float:
        best = self.best
        return best.throughput if best else 0.0

    @property
    def peak(self) -> float:
        """The most requests/s any level reached, acceptable or not."""
        return max((lv.throughput for lv in self.levels), default=0.0)

    @property
    def lowest_p99(self) -> Optional[float]:
        p99s = [lv.percentile(99) for lv in self.levels if lv.latencies_ms and not lv.errors]
        return min(p99s) if p99s else None

    def summary(self) -> str:
        """ "123.4 req/s", or why none counts: "none within the objective (lowest p99 45 ms)"."""
        if self.best is not None:
            return f"{self.throughput:.1f} req/s"
        low = self.lowest_p99
        return "none within the objective" + (f" (lowest p99 {low:.0f} ms)" if low is not None else "")

    def sort_key(self) -> tuple:
        best = self.best
        if best is not None:
            return (1, best.throughput)
        p99s = [lv.percentile(99) for lv in self.levels if lv.latencies_ms]
        return (0, -min(p99s) if p99s else float("-inf"))

    def to_dict(self) -> dict:
        best = self.best
        return {
            "throughput_rps": round(self.throughput, 2),
            "peak_rps": round(self.peak, 2),
            "p50_ms": round(best.percentile(50), 2) if best else None,
            "p99_ms": round(best.percentile(99), 2) if best else None,
            "clients": int(best.level) if best else None,
            "seconds": round(self.seconds, 1),
            "levels": [_level(lv) for lv in self.levels],
        }


def _level(lv: LevelResult) -> dict:
    """One level of a figure in tune-report.json: the client's figures and, where the server sent them, its mean
    stage split (Server-Timing; the report's serving section draws it)."""
    out = {"clients": int(lv.level), "rps": round(lv.throughput, 2), "p99_ms": round(lv.percentile(99), 2)}
    if lv.latencies_ms:
        out.update(p50_ms=round(lv.percentile(50), 2), mean_ms=round(lv.mean_ms, 2))
    if lv.stages:
        out["server_timing_ms"] = {k: round(v, 3) for k, v in lv.stages.items()}
    return out


def measure_candidate(
    target: Target,
    images: Sequence[bytes],
    start_clients: int,
    level_s: float,
    slo_p99_ms: Optional[float] = None,
    warmup_s: float = 1.0,
    stop: Callable[[], bool] = lambda: False,
) -> Figure:
    """Closed-loop levels from ``start_clients``: doubling until the throughput stops growing; where the first
    level is not acceptable (its p99 over the goal), halving until one is or one client is reached. ``stop()``
    ends it early (the budget is spent: ``Figure.complete`` is then False)."""
    import time

    t0 = time.monotonic()
    factory = lambda: open_client(target)  # noqa: E731
    if warmup_s > 0:
        closed_loop(factory, images, max(1, start_clients), duration_s=warmup_s)
    figure = Figure(slo_p99_ms=slo_p99_ms)

    def level(clients: int) -> Optional[LevelResult]:
        if stop():
            figure.complete = False
            return None
        result = closed_loop(factory, images, clients, duration_s=level_s)
        figure.levels.append(result)
        return result

    clients = max(1, min(start_clients, MAX_CLIENTS))
    first = level(clients)
    if first is not None and not figure.acceptable(first) and not first.errors:
        while clients > 1:  # lighter loads, until one meets the goal
            clients //= 2
            lower = level(clients)
            if lower is None or figure.acceptable(lower):
                break
    elif first is not None and not first.errors:
        while clients * 2 <= MAX_CLIENTS:  # heavier loads, while the throughput grows
            clients *= 2
            previous = figure.peak
            more = level(clients)
            if more is None or more.errors or more.throughput < SATURATED * previous or not figure.acceptable(more):
                break
    figure.seconds = time.monotonic() - t0
    return figure


__all__ = ["Figure", "measure_candidate", "SATURATED", "P99_OVER_P50"]
