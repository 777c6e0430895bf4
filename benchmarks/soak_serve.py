"""`vitdeploy serve` with everything on, under a steady load for an hour: does the replica's memory grow, does
its p99 drift, does any request fail? (issue 40's goals: 0 errors, after the warm-up a replica RSS slope
<= 10 MiB/h and a p99 that does not drift upward.)

The server is a `vitdeploy serve` subprocess on a local Ray, started as bench_serve.py starts it, with stage
timing (Server-Timing, stage histograms), Prometheus metrics (scraped every window, as Prometheus would),
HTTPS (a certificate made for the run; the clients verify it) and a bearer token. The load is the project's
own load generator (``vitdeploy.client.loadgen.open_loop``: `vitdeploy loadtest`'s keep-alive clients, latency
timed from when each request was due): a fixed rate, by default half the throughput a closed-loop probe of
``--probe-s`` seconds reaches first (as bench_rollout.py loads its server).

Every ``--every`` seconds (a window): the replica's resident memory (Ray's worker process of the deployment,
``ray::ServeReplica:...``, found by pid; a new pid is a restart and fails the soak), every process of the
server's tree, the window's throughput, p50/p99, errors, the server's stage split and the size of /metrics,
and the CPU other processes took. Each window goes to ``samples.json`` in ``--out`` as it ends.

At the end, over the windows after the warm-up (``--warmup`` minutes, default 10, a third of a shorter run):
the replica's RSS slope per hour, least squares, with its 95% interval for autocorrelated samples and the
slopes of the two halves (a warm-up's end slows down, a leak does not: vitdeploy/evaluate/trend.py); the p99
drift (slope, and the median p99 of the first third against the last); the errors; a verdict per goal, and
``soak.png`` (memory, latency, throughput over time). Exit status 0 when every goal is met, 1 otherwise.

The warm-up cut: 10 minutes. ONNX Runtime's arenas, glibc's malloc arenas (one per thread that allocates:
decode threads, model-call threads, Ray's own) and Ray's metric buffers fill in the first minutes at a new
load; in the 12-minute soak of issue 30 the latencies were steady from minute 2 and the replica's RSS rose
+17 MiB/h over minutes 3-12, which ten minutes could not place. Ten minutes leave 50 of an hour (100 windows of
30 s) for the slope; the halves' slopes then say whether the growth was still slowing.

    .venv/bin/python benchmarks/soak_serve.py                          # demo model, 60 minutes
    .venv/bin/python benchmarks/soak_serve.py --minutes 3 --every 10   # a check that it works
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _serve_kit import (
    DEFAULT_CACHE,
    Server,
    certificate,
    client,
    demo_artifacts,
    demo_digits,
    free_port,
    photos,
    tree_pids,
    vit_small_artifacts,
)

from vitdeploy.base.machine import cpu_model
from vitdeploy.evaluate import reliability
from vitdeploy.evaluate.trend import fit_trend, judge_drift, judge_growth

MIB = 2**20
REPLICA = "ServeReplica"


def process(pid: int) -> tuple[int, str] | None:
    """(resident bytes, command line) of ``pid``; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    rss = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return rss, cmdline


def short(cmdline: str) -> str:
    """A stable name for a process of the tree: Ray titles its workers ``ray::<role>``."""
    if cmdline.startswith("ray::"):  # ray::ProxyActor, also while it runs a method (ray::ProxyActor.receive...)
        return cmdline.split()[0].split(".")[0][:48]
    for key in ("vitdeploy.cli serve", "gcs_server", "raylet", "dashboard_agent", "runtime_env", "log_monitor"):
        if key in cmdline:
            return key
    return os.path.basename(cmdline.split()[0]) if cmdline else "?"


def memory(root: int) -> tuple[dict[int, int], dict[str, int]]:
    """The replica processes' RSS by pid, and every process of the server's tree by name (bytes)."""
    replicas: dict[int, int] = {}
    by_name: dict[str, int] = {}
    for pid in tree_pids([root]):
        got = process(pid)
        if got is None:
            continue
        rss, cmdline = got
        if cmdline.startswith("ray::") and REPLICA in cmdline:
            replicas[pid] = rss
        name = short(cmdline)
        by_name[name] = by_name.get(name, 0) + rss
    return replicas, by_name


def scrape(url: str) -> dict[str, int]:
    """The size of the Prometheus text (bytes, series): a label that grows without bound shows here."""
    import httpx

    try:
        text = httpx.get(url, timeout=10).text
    except httpx.HTTPError:
        return {"metrics_bytes": -1, "metrics_series": -1, "stage_series": -1}
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {
        "metrics_bytes": len(text),
        "metrics_series": len(lines),
        "stage_series": sum(1 for line in lines if line.startswith("ray_vitdeploy_stage_ms")),
    }


def window_record(level, t0: float, t1: float, server: Server, window, replicas, by_name) -> dict:
    """One window's sample: the load generator's figures, memory, /metrics, contention."""
    return {
        "start_s": round(t0, 2),
        "end_s": round(t1, 2),
        "requests": level.sent,
        "ok": level.ok,
        "errors": level.errors,
        "error_examples": {s: level.examples[s] for s in level.errors if s in level.examples},
        "throughput_rps": round(level.throughput, 2),
        "p50_ms": round(level.percentile(50), 3),
        "p99_ms": round(level.percentile(99), 3),
        "max_ms": round(level.percentile(100), 3),
        "backlog_max": level.backlog_max,
        "client_cores": round(level.client_cores, 3),
        "server_timing_ms": {k: round(v, 3) for k, v in level.stages.items()},
        "replica_rss_mib": round(sum(replicas.values()) / MIB, 3),
        "replica_pids": sorted(replicas),
        "rss_by_process_mib": {k: round(v / MIB, 3) for k, v in sorted(by_name.items())},
        "tree_rss_mib": round(sum(by_name.values()) / MIB, 3),
        **scrape(server.metrics_url),
        "contention": window.to_dict() if window else None,
    }


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        return "?"


def header(args: argparse.Namespace) -> dict:
    import onnxruntime
    import ray

    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": {"vitdeploy": git_commit(), "ray": ray.__version__, "onnxruntime": onnxruntime.__version__},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def start(args: argparse.Namespace) -> tuple[Server, list[bytes], str]:
    artifacts = demo_artifacts(args.cache) if args.model == "demo" else vit_small_artifacts(args.cache)
    bodies = demo_digits() if args.model == "demo" else photos()
    certs = certificate(Path(tempfile.mkdtemp(prefix="soak-tls-")))
    token = secrets.token_urlsafe(24)  # never printed
    server = Server(
        artifacts,
        threads=args.threads,
        max_batch=8,
        wait_ms=5,
        decode_threads=2,
        port=free_port(),
        metrics_port=free_port(),
        stage_timing=True,
        tls=certs,
        token=token,
    )
    return server, bodies, token


def probe_rate(args: argparse.Namespace, factory, bodies: list[bytes]) -> tuple[float, dict]:
    """The steady rate: ``--rate``, or ``--load`` x the throughput of a closed-loop probe (after 5 s of warm-up)."""
    from vitdeploy.client.loadgen import closed_loop

    if args.rate:
        return args.rate, {}
    closed_loop(factory, bodies, args.clients, duration_s=5.0)
    probe = closed_loop(factory, bodies, args.clients, duration_s=args.probe_s)
    rate = round(probe.throughput * args.load, 1)
    print(
        f"probe: {args.clients} closed-loop clients for {args.probe_s:g} s: {probe.throughput:.1f} req/s (p99 "
        f"{probe.percentile(99):.1f} ms, errors {sum(probe.errors.values())}); steady load {args.load:g}x: "
        f"{rate:g} req/s",
        flush=True,
    )
    return rate, probe.to_dict()


def soak(args: argparse.Namespace, server: Server, factory, bodies: list[bytes], rate: float, doc: dict) -> None:
    """The windows, each appended to ``doc["windows"]`` and written out as it ends (Ctrl-C ends the soak early)."""
    from vitdeploy.client.loadgen import open_loop

    root = server.proc.pid
    print(
        f"{'min':>5} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} {'replica':>9} {'tree':>9} {'others':>6}"
    )
    begin, k = time.monotonic(), 0
    try:
        while time.monotonic() - begin < args.minutes * 60:
            t0 = time.monotonic() - begin
            seconds = min(args.every, args.minutes * 60 - t0)
            before = reliability.sample(tree_pids([root]))
            level = open_loop(factory, bodies, rate, seconds, connections=args.connections, seed=k)
            window = reliability.contention(before, reliability.sample(tree_pids([root])))
            replicas, by_name = memory(root)
            rec = window_record(level, t0, time.monotonic() - begin, server, window, replicas, by_name)
            doc["windows"].append(rec)
            write_json(args.out / "samples.json", doc)
            k += 1
            print(
                f"{rec['end_s'] / 60:5.1f} {rec['throughput_rps']:7.1f} {rec['p50_ms']:7.1f} {rec['p99_ms']:7.1f} "
                f"{sum(rec['errors'].values()):6d} {rec['replica_rss_mib']:7.1f}Mi {rec['tree_rss_mib']:7.0f}Mi "
                f"{window.competing_cores if window else math.nan:6.2f}",
                flush=True,
            )
    except KeyboardInterrupt:
        print(f"interrupted after {(time.monotonic() - begin) / 60:.1f} min: judging the windows so far", flush=True)


def analyse(windows: list[dict], args: argparse.Namespace, probe: dict) -> dict:
    """The verdicts: errors, replica restarts, the replica's RSS slope and the p99 drift after the warm-up."""
    cut = args.warmup * 60
    kept = [w for w in windows if w["start_s"] >= cut - 1e-6]
    errors = sum(sum(w["errors"].values()) for w in windows) + sum((probe.get("errors") or {}).values())
    pids = [tuple(w["replica_pids"]) for w in windows]
    restarts = sum(1 for a, b in zip(pids, pids[1:]) if a != b) + sum(1 for p in pids if not p)
    out: dict = {
        "warmup_min": args.warmup,
        "windows_judged": len(kept),
        "requests": sum(w["requests"] for w in windows),
        "errors": errors,
        "replica_restarts": restarts,
        "verdicts": {
            "errors": {"met": errors == 0, "text": f"{errors} errors: " + ("met" if errors == 0 else "NOT MET")},
            "replica": {
                "met": restarts == 0,
                "text": "the replica kept its process"
                if restarts == 0
                else f"{restarts} replica pid changes: NOT MET",
            },
        },
    }
    if len(kept) < 3:
        out["verdicts"]["windows"] = {"met": False, "text": f"{len(kept)} windows after the warm-up: too few to judge"}
        return out
    t = [w["end_s"] for w in kept]
    rss = fit_trend(t, [w["replica_rss_mib"] for w in kept])
    growth = judge_growth(rss, args.rss_limit)
    p99, drift = judge_drift(t, [w["p99_ms"] for w in kept], args.p99_tolerance)
    out["replica_rss_trend_mib_per_h"] = rss.to_dict()
    out["p99_trend_ms_per_h"] = p99.to_dict()
    out["other_trends_mib_per_h"] = {
        name: fit_trend(t, [w["rss_by_process_mib"].get(name, 0.0) for w in kept]).to_dict()["slope"]
        for name in sorted({n for w in kept for n in w["rss_by_process_mib"]})
    }
    out["other_trends_mib_per_h"]["the whole tree"] = fit_trend(t, [w["tree_rss_mib"] for w in kept]).slope
    out["verdicts"]["replica_rss"] = {"met": growth.met, "text": growth.text}
    out["verdicts"]["p99_drift"] = {"met": drift.met, "text": drift.text}
    return out


def signed(value: float | None) -> str:
    return "unbounded" if value is None else f"{value:+.1f}"


def report(doc: dict) -> bool:
    """Print the analysis; True when every goal is met."""
    a, windows = doc["analysis"], doc["windows"]
    print(
        f"\n{a['requests']} requests in {len(windows)} windows; judged: the {a['windows_judged']} windows after the "
        f"first {a['warmup_min']:.3g} min"
    )
    if "replica_rss_trend_mib_per_h" in a:
        rss = a["replica_rss_trend_mib_per_h"]
        kept = [w for w in windows if w["start_s"] >= a["warmup_min"] * 60 - 1e-6]
        print(
            f"replica RSS {kept[0]['replica_rss_mib']:.1f} -> {kept[-1]['replica_rss_mib']:.1f} MiB; slope "
            f"{rss['slope']:+.1f} MiB/h (95% interval {signed(rss['low'])} to {signed(rss['high'])}; the samples "
            f"are worth {rss['effective']:.0f} of {rss['points']}), residual spread {rss['residual_sd']:.2f} MiB;"
            f" first half {rss['first_half']:+.1f} MiB/h, second half {rss['second_half']:+.1f} MiB/h"
            + (
                "  (slowing down: the end of a warm-up)"
                if abs(rss["second_half"]) < abs(rss["first_half"]) / 3
                else ""
            )
        )
        others = a["other_trends_mib_per_h"]
        print("other processes' RSS slopes (MiB/h): " + ", ".join(f"{k} {v:+.1f}" for k, v in others.items()))
    busy = [w["contention"]["competing_cores"] for w in windows if w.get("contention")]
    if busy:
        print(f"contention: other processes took {np.median(busy):.2f} cores (median of windows; max {max(busy):.2f})")
    ok = True
    for name, v in a["verdicts"].items():
        ok = ok and v["met"] is True
        print(f"  {name:<12} {v['text']}")
    print("SOAK: " + ("PASS" if ok else "FAIL"), flush=True)
    return ok


def plot(doc: dict, path: Path) -> None:
    """Memory, latency and throughput per window, the warm-up shaded and the fitted lines drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows, a = doc["windows"], doc["analysis"]
    m = np.array([w["end_s"] for w in windows]) / 60
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, sharex=True, figsize=(10, 9))
    ax1.plot(m, [w["replica_rss_mib"] for w in windows], ".-", label="replica RSS")
    ax2.plot(m, [w["p50_ms"] for w in windows], ".-", label="p50")
    ax2.plot(m, [w["p99_ms"] for w in windows], ".-", label="p99")
    ax3.plot(m, [w["throughput_rps"] for w in windows], ".-", label="answered req/s")
    ax3.bar(m, [sum(w["errors"].values()) for w in windows], width=0.3, color="red", label="errors")
    kept = [w for w in windows if w["start_s"] >= a["warmup_min"] * 60 - 1e-6]
    for ax, key, trend in (
        (ax1, "replica_rss_mib", "replica_rss_trend_mib_per_h"),
        (ax2, "p99_ms", "p99_trend_ms_per_h"),
    ):
        ax.axvspan(0, a["warmup_min"], color="0.9", label="warm-up (not judged)")
        if trend in a and len(kept) >= 2:
            t = np.array([w["end_s"] for w in kept])
            fit = np.polyfit(t, [w[key] for w in kept], 1)
            ax.plot(t / 60, np.polyval(fit, t), "k--", label=f"fit {a[trend]['slope']:+.1f}/h")
        ax.legend(loc="best", fontsize=8)
    ax1.set_ylabel("MiB")
    ax2.set_ylabel("ms")
    ax3.set_ylabel("req/s")
    ax3.legend(loc="best", fontsize=8)
    ax3.set_xlabel("minutes")
    fig.suptitle(
        f"soak_serve.py: {doc['settings']['model']} at {doc['rate_rps']:g} req/s, {doc['date']}, "
        f"{doc['machine']['cpu']} ({doc['machine']['logical_cpus']} CPUs)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("demo", "vit-s"), default="demo")
    ap.add_argument("--minutes", type=float, default=60.0, help="the steady load's length (default 60)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds per window (default 30)")
    ap.add_argument(
        "--warmup", type=float, default=None, help="minutes not judged (default 10, a third of a shorter run)"
    )
    ap.add_argument("--rate", type=float, default=None, help="requests/s (default: --load x the probe's throughput)")
    ap.add_argument(
        "--load", type=float, default=0.5, help="the steady rate as a fraction of the probe's (default 0.5)"
    )
    ap.add_argument("--clients", type=int, default=8, help="the probe's closed-loop clients (default 8)")
    ap.add_argument("--probe-s", type=float, default=30.0, help="the probe's seconds (default 30)")
    ap.add_argument("--connections", type=int, default=16, help="the steady load's keep-alive connections")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="serve.num_cpus_per_replica")
    ap.add_argument("--rss-limit", type=float, default=10.0, help="the replica's RSS slope goal, MiB/h (default 10)")
    ap.add_argument("--p99-tolerance", type=float, default=0.10, help="p99 rise first->last third allowed (0.10)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: under --cache, dated)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument(
        "--judge",
        type=Path,
        metavar="SAMPLES_JSON",
        help="judge (and plot) a soak's samples.json again, with this --warmup, --rss-limit, --p99-tolerance: "
        "no server is started; the verdict and the plot are written beside it",
    )
    args = ap.parse_args()
    if args.judge:
        args.minutes = json.loads(args.judge.read_text())["settings"]["minutes"]
    if args.warmup is None:
        args.warmup = min(10.0, args.minutes / 3)
    args.out = args.out or args.cache / time.strftime("soak-%Y%m%d-%H%M%S")
    return args


def judge_again(args: argparse.Namespace) -> int:
    """``--judge``: the analysis, the verdict and the plot of a finished soak, with this run's cut and goals."""
    doc = json.loads(args.judge.read_text())
    print(f"{args.judge}: {doc['command']}; date: {doc['date']}; {len(doc['windows'])} windows")
    doc["analysis"] = analyse(doc["windows"], args, doc.get("probe") or {})
    ok = report(doc)
    write_json(args.judge, doc)
    plot(doc, args.judge.parent / "soak.png")
    print(f"written: {args.judge}, {args.judge.parent / 'soak.png'}")
    return 0 if ok else 1


def main() -> int:
    args = arguments()
    if args.judge:
        return judge_again(args)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {**header(args), "windows": []}
    print(f"command: {doc['command']}; date: {doc['date']}; vitdeploy {doc['versions']['vitdeploy']}")
    print(f"cpu: {doc['machine']['cpu']} ({doc['machine']['logical_cpus']} logical CPUs); output: {args.out}")
    server, bodies, token = start(args)
    try:
        factory = lambda: client(server.url, token)  # noqa: E731
        rate, doc["probe"] = probe_rate(args, factory, bodies)
        doc["rate_rps"] = rate
        print(
            f"{args.model}: {rate:g} req/s over {args.connections} keep-alive HTTPS connections with a token, stage "
            f"timing and metrics on, for {args.minutes:g} min; a window every {args.every:g} s; the first "
            f"{args.warmup:.3g} min not judged",
            flush=True,
        )
        soak(args, server, factory, bodies, rate, doc)
    finally:
        print(f"server exit code {server.stop()}", flush=True)
    doc["analysis"] = analyse(doc["windows"], args, doc.get("probe") or {})
    ok = report(doc)
    write_json(args.out / "samples.json", doc)
    if doc["windows"]:
        plot(doc, args.out / "soak.png")
    print(f"written: {args.out / 'samples.json'}, {args.out / 'soak.png'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
