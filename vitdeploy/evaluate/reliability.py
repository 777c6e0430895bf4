"""When a speed ratio cannot be trusted: the load average and each figure's spread.

On a shared machine, torch's OpenMP threads collapse under contention (they wait for each other at
every operator), so a ratio measured while other work competed for the cores says little. These
checks mark such ratios instead of printing them as facts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .bench import BenchResult


SPREAD_LIMIT = 1.5  # p90/p50 above this: the figure was disturbed while it was measured
LOAD_SLACK = 0.5  # load average + threads may exceed the usable cores by this much


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (runnable processes), or None where unknown."""
    try:
        return tuple(round(v, 2) for v in os.getloadavg())  # type: ignore[return-value]
    except (AttributeError, OSError):
        return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_machine_reason(load_before: float | None, cores: int, threads: int | None,
                        load_after: float | None = None) -> str | None:
    """Why the 1-minute load average says other work competed for the cores, or None.

    Other processes' load is taken as the load before the run, or the load after it less the
    benchmark's own ``threads`` (which catches work that started during a long run), whichever is
    higher. A backend with ``threads`` intra-op threads (None: one per core) needs that many
    cores; when other work leaves fewer free, its threads get descheduled, and torch's OpenMP
    threads, which wait for each other at every operator, collapse (seen: p50 287 ms at batch 1
    where one thread takes 1.7 ms)."""
    needed = threads or cores
    known = [v for v in (load_before, None if load_after is None else load_after - needed) if v is not None]
    if not known:
        return None
    others = max(known)
    if others + needed > cores + LOAD_SLACK:
        return f"load {others:.1f} on {cores} cores"
    return None


def unreliable_reasons(result: BenchResult, baseline: BenchResult | None, busy: str | None) -> list[str]:
    """Why ``result``'s ratio to ``baseline`` (the eager torch result at the same batch size) is
    unreliable: either figure's p90/p50 above :data:`SPREAD_LIMIT`, or a busy machine."""
    reasons = []
    for r in (baseline, result) if baseline is not None and baseline is not result else (result,):
        if r.stats.spread > SPREAD_LIMIT:
            reasons.append(f"{r.backend} p90/p50 {r.stats.spread:.1f}")
    if busy:
        reasons.append(busy)
    return reasons


def mark_unreliable(results: list[BenchResult], busy: str | None, baseline: str) -> None:
    """Set each result's ``unreliable`` reasons (see :func:`unreliable_reasons`)."""
    base = {r.batch_size: r for r in results if r.backend == baseline}
    for r in results:
        r.unreliable = unreliable_reasons(r, base.get(r.batch_size), busy)


__all__ = ["LOAD_SLACK", "SPREAD_LIMIT", "busy_machine_reason", "load_average", "mark_unreliable", "unreliable_reasons",
           "usable_cores"]
