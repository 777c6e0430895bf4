"""The load: closed loop (N clients, each sends its next request when its answer is back) and open loop
(requests due at a fixed or Poisson rate, each timed from when it was due).

An open-loop latency starts when the request was *due*, not when a free connection sent it: a server that
stalls for a second shows a second more on every request due meanwhile, instead of hiding its queue behind
a client that waited too (coordinated omission, the point of wrk2 and of perf_analyzer's request-rate mode).
Requests due while every connection is busy wait in the generator and that wait counts; ``backlog_max``
says how far behind the generator fell.

Both loops time their own CPU (this process's, ``time.process_time``) so the caller can tell a level where the
client, not the server, was the limit.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from .protocols import OK, Client

ClientFactory = Callable[[], Client]


@dataclass
class LevelResult:
    """One load level's figures: ``mode`` "concurrency" or "rate", ``level`` the clients or requests/s asked."""

    mode: str
    level: float
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)  # of the answered requests (status OK)
    statuses: Counter = field(default_factory=Counter)  # status -> count, every request sent
    examples: dict[str, str] = field(default_factory=dict)  # status -> the start of one failed answer
    client_cpu_s: float = 0.0
    backlog_max: int = 0  # open loop: most requests due but not yet sent at once
    server: Optional[dict] = None  # server_stats.delta over the level, where the server exposes it
    #: the server's own split of the answered requests (Server-Timing): mean ms per stage and ``requests``
    stages: dict = field(default_factory=dict)
    #: (time.time() it was answered, latency ms) of each answered request, in order: a window of the level (a
    #: rollout's swap, benchmarks/bench_rollout.py) is judged on the requests answered inside it
    timeline: list[tuple[float, float]] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def ok(self) -> int:
        return sum(n for s, n in self.statuses.items() if s in OK)

    @property
    def errors(self) -> dict[str, int]:
        return {s: n for s, n in sorted(self.statuses.items()) if s not in OK}

    @property
    def throughput(self) -> float:
        """Answered requests per second (failures do not count)."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @property
    def mean_ms(self) -> float:
        """The answered requests' mean latency (what the server's mean stage split adds up to, with the network)."""
        return float(np.mean(self.latencies_ms)) if self.latencies_ms else float("nan")

    @property
    def client_cores(self) -> float:
        """Cores the load generator itself used on average (its CPU seconds / wall seconds)."""
        return self.client_cpu_s / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        out = {
            "mode": self.mode,
            "level": self.level,
            "seconds": round(self.seconds, 3),
            "requests": self.sent,
            "ok": self.ok,
            "throughput_rps": round(self.throughput, 2),
            "latency_ms": {
                k: round(self.percentile(q), 3) if self.latencies_ms else None
                for k, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
            }
            | {"mean": round(self.mean_ms, 3) if self.latencies_ms else None},
            "errors": self.errors,
            "error_examples": {s: self.examples[s] for s in self.errors if s in self.examples},
            "client_cores": round(self.client_cores, 3),
        }
        if self.mode == "rate":
            out["backlog_max"] = self.backlog_max
        if self.server is not None:
            out["server"] = self.server
        if self.stages:
            out["server_timing_ms"] = {k: round(v, 3) for k, v in self.stages.items()}
        return out


class _Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.statuses: Counter = Counter()
        self.examples: dict[str, str] = {}
        self.stage_sums: dict[str, float] = {}
        self.timed = 0
        self.timeline: list[tuple[float, float]] = []

    def add(self, status: str, example: str, latency_ms: float, timing: Optional[dict] = None) -> None:
        with self.lock:
            self.statuses[status] += 1
            if status in OK:
                self.latencies.append(latency_ms)
                if timing:  # the server's Server-Timing of this answer
                    self.timed += 1
                    for stage, ms in timing.items():
                        self.stage_sums[stage] = self.stage_sums.get(stage, 0.0) + ms
                self.timeline.append((time.time(), latency_ms))
            elif example and status not in self.examples:
                self.examples[status] = example

    def result(self, mode: str, level: float, conns: Sequence[Client], wall0: float, cpu0: float) -> LevelResult:
        """The level's figures once its threads are done (``wall0``/``cpu0``: perf_counter/process_time at its
        start); the connections are closed."""
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        for c in conns:
            c.close()
        result = LevelResult(mode, level, wall, self.latencies, self.statuses, self.examples, cpu)
        if self.timed:
            result.stages = {k: v / self.timed for k, v in self.stage_sums.items()}
            result.stages["requests"] = self.timed
        result.timeline = self.timeline
        return result


class _Stop:
    """When a level ends: at ``deadline`` (monotonic s) or after ``requests`` sent, whichever comes first."""

    def __init__(self, duration_s: Optional[float], requests: Optional[int]) -> None:
        self.deadline = time.monotonic() + duration_s if duration_s else float("inf")
        self.left = requests if requests else None
        self.lock = threading.Lock()

    def take(self) -> bool:
        """True while another request may be sent (and counts it)."""
        if time.monotonic() >= self.deadline:
            return False
        if self.left is None:
            return True
        with self.lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True


def closed_loop(
    factory: ClientFactory,
    images: Sequence[bytes],
    clients: int,
    duration_s: Optional[float] = None,
    requests: Optional[int] = None,
) -> LevelResult:
    """``clients`` threads, each with its own connection, sending images (cycled, each client from its own
    offset) until the duration is over or ``requests`` were sent."""
    rec, stop = _Recorder(), _Stop(duration_s, requests)
    conns = [factory() for _ in range(clients)]

    def run(k: int) -> None:
        i = k
        while stop.take():
            t0 = time.perf_counter()
            status, example = conns[k].send(images[i % len(images)])
            rec.add(status, example, (time.perf_counter() - t0) * 1000.0, getattr(conns[k], "server_timing", None))
            i += clients

    cpu0, wall0 = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rec.result("concurrency", clients, conns, wall0, cpu0)


def due_times(rate: float, count: int, poisson: bool, seed: int = 0) -> list[float]:
    """Offsets in seconds from the start at which each of ``count`` requests is due: every 1/rate, or
    exponential gaps of mean 1/rate (a Poisson process, seeded)."""
    if not poisson:
        return [i / rate for i in range(count)]
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def open_loop(
    factory: ClientFactory,
    images: Sequence[bytes],
    rate: float,
    duration_s: Optional[float] = None,
    requests: Optional[int] = None,
    poisson: bool = False,
    connections: int = 64,
    seed: int = 0,
) -> LevelResult:
    """Requests due at ``rate`` per second for ``duration_s`` (or ``requests`` of them), sent by a pool of
    ``connections`` keep-alive connections; each latency runs from the request's due time to its answer."""
    count = int(requests) if requests else max(1, int(round(rate * float(duration_s or 0))))
    due = due_times(rate, count, poisson, seed)
    rec, work = _Recorder(), queue.Queue()
    backlog = [0]
    conns = [factory() for _ in range(connections)]

    def run(k: int) -> None:
        while True:
            item = work.get()
            if item is None:
                return
            i, due_at = item
            status, example = conns[k].send(images[i % len(images)])
            rec.add(status, example, (time.perf_counter() - due_at) * 1000.0, getattr(conns[k], "server_timing", None))

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(connections)]
    for t in threads:
        t.start()
    cpu0, start = time.process_time(), time.perf_counter()
    for i, offset in enumerate(due):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        work.put((i, start + offset))
        backlog[0] = max(backlog[0], work.qsize())
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    result = rec.result("rate", rate, conns, start, cpu0)
    result.backlog_max = backlog[0]
    return result


__all__ = ["LevelResult", "closed_loop", "open_loop", "due_times", "ClientFactory"]
