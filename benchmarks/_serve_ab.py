"""``bench_serve.py --compare stage-timing,https``: what a server feature costs, `vitdeploy serve` against
`vitdeploy serve` in the same rounds (issue 40's goals).

Every server is started the same way (:class:`_serve_kit.Server`: a `vitdeploy serve` subprocess on its own
local Ray, the same artifacts, threads, batching and decode threads); they run side by side and each round sends
every one the same requests from the same keep-alive clients, one server after the other in an order that
rotates. The servers:

* ``http``             plain HTTP, ``serve.stage_timing`` on (the default): the baseline of both comparisons;
* ``no stage timing``  ``serve.stage_timing: false`` (no Server-Timing header, no stage histograms);
* ``https``            ``serve.tls`` with a certificate made for the run (clients verify it), stage timing on.

Printed per comparison: the ratio of throughputs and of p50 latencies per round, their median with the spread
(min-max), the cost (1 - throughput ratio; p50 ratio - 1) against the goal, and each round's contention (the
CPU other processes took, :mod:`vitdeploy.evaluate.reliability`). Goals: stage timing costs <= 2% of p50 and of
throughput (ViT-S/16 and the demo model); HTTPS <= 5% of throughput at the demo model's load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from _serve_kit import Server, certificate, client, concurrent, free_port, spread, tree_pids

from vitdeploy.evaluate import reliability

HTTP, NO_TIMING, HTTPS = "http", "no stage timing", "https"


@dataclass(frozen=True)
class Comparison:
    name: str  # the --compare word
    measured: str  # the server with the feature
    baseline: str  # the server without it
    goal: float  # the most it may cost (a fraction)
    judged: tuple[str, ...]  # what the goal applies to: "throughput", "p50"


COMPARISONS = {
    "stage-timing": Comparison("stage-timing", HTTP, NO_TIMING, 0.02, ("throughput", "p50")),
    "https": Comparison("https", HTTPS, HTTP, 0.05, ("throughput",)),
}


def start_servers(names: list[str], artifacts: Path, args: argparse.Namespace) -> dict[str, Server]:
    """One `vitdeploy serve` per name, each with the benchmark's serve settings and its own feature."""
    servers: dict[str, Server] = {}
    certs = certificate(Path(tempfile.mkdtemp(prefix="bench-serve-tls-"))) if HTTPS in names else None
    try:
        for name in names:
            print(f"  starting the {name!r} server", flush=True)
            servers[name] = Server(
                artifacts,
                args.threads,
                args.max_batch,
                args.wait_ms,
                args.decode_threads,
                free_port(),
                free_port(),
                args.concurrent_batches,
                args.server_threads,
                stage_timing=name != NO_TIMING,
                tls=certs if name == HTTPS else None,
            )
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def ab_model(label: str, artifacts: Path, args: argparse.Namespace, images: list[bytes]) -> dict[str, object]:
    """The comparisons ``args.compare`` names on one model; {comparison: its figures}."""
    chosen = [COMPARISONS[c] for c in args.compare if c in COMPARISONS]
    names = [n for n in (HTTP, NO_TIMING, HTTPS) if any(n in (c.baseline, c.measured) for c in chosen)]
    n = args.requests_demo if "demo" in label else args.requests
    work = [images[i % len(images)] for i in range(n)]
    print(
        f"\n== {label}, {', '.join(c.name for c in chosen)}: servers {', '.join(names)}; {n} requests x "
        f"{args.rounds} rounds, {args.clients} keep-alive clients, {args.threads} ORT threads",
        flush=True,
    )
    servers = start_servers(names, artifacts, args)
    try:
        rates, p50s, competing, busy = rounds(servers, work, args)
    finally:
        for name, server in servers.items():
            print(f"  {name} server exit code {server.stop()}", flush=True)
    return {c.name: judge(c, rates, p50s, competing, busy) for c in chosen}


def rounds(
    servers: dict[str, Server], work: list[bytes], args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float | None], list[str]]:
    """Each round sends ``work`` to every server in turn (the order rotating); per server its req/s and p50 (ms)
    per round, the competing cores per round and why a round was disturbed."""
    failures: list[str] = []

    def post(blob: bytes, connection: object) -> None:
        status, example = connection.send(blob)  # type: ignore[attr-defined]
        if status != "200":
            failures.append(f"{status}: {example[:200]}")

    def run(server: Server) -> Callable[[list[bytes]], tuple[float, list[float]]]:
        return lambda items: concurrent(post, items, args.clients, lambda: client(server.url, server.token))

    calls = {name: run(server) for name, server in servers.items()}
    for call in calls.values():
        call(work[: args.clients * 4])  # warm-up
    own = lambda: tree_pids([s.proc.pid for s in servers.values()])  # noqa: E731
    names = list(servers)
    rates: dict[str, list[float]] = {k: [] for k in names}
    p50s: dict[str, list[float]] = {k: [] for k in names}
    competing: list[float | None] = []
    busy: list[str] = []
    for r in range(args.rounds):
        start = reliability.sample(own())
        line = []
        for name in names[r % len(names) :] + names[: r % len(names)]:
            rate, lat = calls[name](work)
            rates[name].append(rate)
            p50s[name].append(float(np.percentile(lat, 50)) * 1000.0)
            line.append(f"{name} {rate:.1f} req/s p50 {p50s[name][-1]:.1f} ms")
        window = reliability.contention(start, reliability.sample(own()))
        competing.append(window.competing_cores if window else None)
        why = reliability.busy_machine_reason(window, None)
        print(
            f"  round {r + 1}: " + ", ".join(line) + "; contention: " + (window.describe() if window else "unknown"),
            flush=True,
        )
        if why:
            busy.append(f"round {r + 1}: {why}")
    print(f"  {'server':<16} {'req/s (median)':>14}  {'spread over rounds':<22} {'p50 ms (median)':>15}")
    for name in names:
        print(
            f"  {name:<16} {statistics.median(rates[name]):>14.1f}  {spread(rates[name]):<22} "
            f"{statistics.median(p50s[name]):>15.1f}"
        )
    print(f"  failed requests {len(failures)}" + (f" (first: {failures[0]})" if failures else ""), flush=True)
    return rates, p50s, competing, busy


def judge(
    c: Comparison,
    rates: dict[str, list[float]],
    p50s: dict[str, list[float]],
    competing: list[float | None],
    busy: list[str],
) -> dict[str, object]:
    """The per-round ratios of ``c``'s two servers, their medians and spread, the costs against the goal."""
    throughput = [a / b for a, b in zip(rates[c.measured], rates[c.baseline])]
    p50 = [a / b for a, b in zip(p50s[c.measured], p50s[c.baseline])]
    costs = {"throughput": 1 - statistics.median(throughput), "p50": statistics.median(p50) - 1}
    met = all(costs[k] <= c.goal for k in c.judged)
    doubts = busy + [
        f"the {k} ratios span {min(v):.3f}-{max(v):.3f} over the rounds, more than the goal's {c.goal:.0%}: more "
        f"rounds or a quieter machine"
        for k, v in (("throughput", throughput), ("p50", p50))
        if k in c.judged and max(v) - min(v) > c.goal
    ]
    busy = [f"{x:.2f}" for x in competing if x is not None]
    print(
        f"  {c.measured} / {c.baseline}: throughput {statistics.median(throughput):.3f} (spread {spread(throughput)}),"
        f" p50 {statistics.median(p50):.3f} (spread {spread(p50)}); cost {costs['throughput']:+.1%} of throughput, "
        f"{costs['p50']:+.1%} of p50; goal <= {c.goal:.0%} of {' and '.join(c.judged)}: "
        f"{'met' if met else 'NOT MET'}; competing cores per round {', '.join(busy) or 'unknown'}",
        flush=True,
    )
    for why in doubts:
        print(f"  ! unreliable: {why}", flush=True)
    return {
        "throughput_ratios": throughput,
        "p50_ratios": p50,
        "costs": costs,
        "competing_cores": competing,
        "goal": c.goal,
        "met": met,
        "unreliable": bool(doubts),
    }
