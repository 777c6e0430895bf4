"""When a speed ratio cannot be trusted: what other processes took of the CPU, and each figure's spread.

On a shared machine, torch's OpenMP threads collapse under contention (they wait for each other at
every operator), so a ratio measured while other work competed for the cores says little. The judge
is what actually competed during the timed window: the CPU time every process took (``/proc/stat``)
less the benchmark's own (``/proc/<pid>/stat`` of its processes, all threads), plus the time the
hypervisor stole. The load average is no judge: it counts the benchmark's own threads and lags by
minutes, so right after an export an idle machine reads "busy".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable

from .timing import BenchResult

SPREAD_LIMIT = 1.5  # p90/p50 above this: the figure was disturbed while it was measured
CORE_SLACK = 0.5  # other work + the benchmark's threads may exceed the usable cores by this much (in cores)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover
        return 100.0


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None


def _machine_seconds() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds since boot of the cores this process may run on (all of them unless
    pinned), from the per-core lines of /proc/stat; None where unknown."""
    allowed = _affinity()
    busy = steal = 0.0
    seen = False
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                fields = line.split()
                if not fields or not fields[0].startswith("cpu") or fields[0] == "cpu":
                    if seen:
                        break  # the per-core lines come first and together
                    continue
                if allowed is not None and int(fields[0][3:]) not in allowed:
                    continue
                seen = True
                values = [float(v) for v in fields[1:]] + [0.0] * 8
                user, nice, system, _idle, _iowait, irq, softirq, stolen = values[:8]
                busy += user + nice + system + irq + softirq  # guest time is inside user already
                steal += stolen
    except (OSError, ValueError):
        return None
    if not seen:
        return None
    tick = _ticks()
    return busy / tick, steal / tick


def process_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) a process has used; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and parentheses
    try:
        return (float(rest[11]) + float(rest[12])) / _ticks()  # fields 14 and 15: utime, stime
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class CpuSample:
    wall: float
    machine: tuple[float, float] | None
    own: dict[int, float]


def sample(own_pids: Iterable[int] = ()) -> CpuSample:
    """The machine's busy/steal CPU seconds and those of the benchmark's own processes (this one and
    ``own_pids``: a server it started, its workers), now."""
    pids = dict.fromkeys([os.getpid(), *own_pids])
    own = {pid: secs for pid in pids if (secs := process_seconds(pid)) is not None}
    return CpuSample(time.perf_counter(), _machine_seconds(), own)


@dataclass(frozen=True)
class Contention:
    """What other processes and the hypervisor took of the CPU while a benchmark ran."""

    wall_s: float
    others_s: float  # CPU seconds of every process but the benchmark's own
    steal_s: float  # CPU seconds the hypervisor gave to other guests
    cores: int

    @property
    def competing_cores(self) -> float:
        """Cores' worth of competing work on average over the window (others + steal)."""
        return (self.others_s + self.steal_s) / self.wall_s if self.wall_s > 0 else 0.0

    def describe(self) -> str:
        return (
            f"other processes took {self.others_s:.2f} CPU-s and steal {self.steal_s:.2f} CPU-s in "
            f"{self.wall_s:.1f} s ({self.competing_cores:.2f} of {self.cores} cores)"
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "wall_s": round(self.wall_s, 3),
            "others_cpu_s": round(self.others_s, 3),
            "steal_cpu_s": round(self.steal_s, 3),
            "competing_cores": round(self.competing_cores, 3),
            "cores": self.cores,
        }


def contention(before: CpuSample, after: CpuSample, cores: int | None = None) -> Contention | None:
    """The competing CPU between two samples; None where /proc is not readable (not Linux).

    The benchmark's own processes are those sampled both times; a process of its own that started
    in between counts as other work (sample its pid first)."""
    if before.machine is None or after.machine is None:
        return None
    busy = after.machine[0] - before.machine[0]
    own = sum(after.own[pid] - before.own[pid] for pid in before.own if pid in after.own)
    return Contention(
        after.wall - before.wall,
        max(0.0, busy - own),
        max(0.0, after.machine[1] - before.machine[1]),
        cores or usable_cores(),
    )


def busy_machine_reason(window: Contention | None, threads: int | None) -> str | None:
    """Why ``window`` says other work competed for the cores the benchmark's ``threads`` needed (None:
    one per core), or None. Flagged when the competing cores plus the threads exceed the usable
    cores by more than :data:`CORE_SLACK`: then some of the threads waited for a core."""
    if window is None:
        return None
    needed = min(threads or window.cores, window.cores)
    if window.competing_cores + needed > window.cores + CORE_SLACK:
        return (
            f"other work took {window.competing_cores:.2f} of {window.cores} cores while "
            f"{needed} thread(s) needed {needed}"
        )
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


__all__ = [
    "CORE_SLACK",
    "Contention",
    "CpuSample",
    "SPREAD_LIMIT",
    "busy_machine_reason",
    "contention",
    "mark_unreliable",
    "process_seconds",
    "sample",
    "unreliable_reasons",
    "usable_cores",
]
