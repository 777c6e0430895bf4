"""`vitdeploy serve` at saturation for a long time: does memory grow, does latency drift?

The server (a `vitdeploy serve` subprocess on a local Ray, as bench_serve.py starts it) is kept busy by
closed-loop keep-alive HTTP clients (each sends its next image as soon as the last is answered: the
server is always saturated) for ``--minutes``. Every ``--every`` seconds the resident memory of each
process of the server's tree (the `serve` command, Ray's GCS and raylet, the HTTP proxy, the replica,
...) is sampled from /proc, and every window's requests give their throughput and p50/p99 latency.

Printed: a row per window (requests/s, p50, p99, the tree's RSS), then per process its RSS at the
start and the end of the measured part and the growth per hour (least-squares slope over the samples
after the first ``--warmup`` minutes, when caches and arenas have filled), and the p99 drift per hour
(the same slope over the windows' p99), with what other processes took of the CPU meanwhile.

    .venv/bin/python benchmarks/soak_serve.py                       # demo model, 12 minutes
    .venv/bin/python benchmarks/soak_serve.py --model vit-s --minutes 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np
from bench_serve import DEFAULT_CACHE, Server, demo_artifacts, demo_digits, photos, tree_pids, vit_small_artifacts

from vitdeploy.base.memory import human
from vitdeploy.evaluate.reliability import contention, sample
from vitdeploy.serve.triton.local import free_port


def rss_and_name(pid: int) -> tuple[int, str] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    rss = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return rss, _short(cmdline)


def _short(cmdline: str) -> str:
    """A stable name for a process of the tree: Ray titles its workers ``ray::<role>``."""
    if cmdline.startswith("ray::"):  # ray::ProxyActor, also while it runs a method (ray::ProxyActor.receive...)
        return cmdline.split()[0].split(".")[0][:48]
    for key in ("vitdeploy.cli serve", "gcs_server", "raylet", "dashboard_agent", "runtime_env", "log_monitor"):
        if key in cmdline:
            return key
    return os.path.basename(cmdline.split()[0]) if cmdline else "?"


def slope_per_hour(times: list[float], values: list[float]) -> float:
    """Least-squares slope of ``values`` against ``times`` (seconds), per hour; 0 with fewer than 2 points."""
    if len(times) < 2:
        return 0.0
    return float(np.polyfit(np.asarray(times), np.asarray(values, dtype=float), 1)[0]) * 3600.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("demo", "vit-s"), default="demo")
    ap.add_argument("--minutes", type=float, default=12.0)
    ap.add_argument("--every", type=float, default=60.0, help="seconds per window (default 60)")
    ap.add_argument("--warmup", type=float, default=2.0, help="minutes left out of the slopes (default 2)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = ap.parse_args()

    import httpx

    artifacts = demo_artifacts(args.cache) if args.model == "demo" else vit_small_artifacts(args.cache)
    bodies = demo_digits() if args.model == "demo" else photos()
    server = Server(
        artifacts,
        threads=os.cpu_count() or 1,
        max_batch=8,
        wait_ms=5,
        decode_threads=2,
        port=free_port(),
        metrics_port=free_port(),
    )
    done: list[tuple[float, float, int]] = []  # (answered at, latency s, status)
    stop = threading.Event()

    def client(seed: int) -> None:
        with httpx.Client(timeout=120) as c:
            i = seed
            while not stop.is_set():
                body = bodies[i % len(bodies)]
                i += 1
                start = time.perf_counter()
                try:
                    status = c.post(
                        f"{server.url}/predict", content=body, headers={"content-type": "application/octet-stream"}
                    ).status_code
                except httpx.HTTPError:
                    status = -1
                done.append((time.monotonic(), time.perf_counter() - start, status))

    roots = [server.proc.pid]
    own = [os.getpid()]
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.clients)]
    begin = time.monotonic()
    before = sample(tree_pids(roots) + own)
    for t in threads:
        t.start()
    windows, memory = [], []  # (t, req/s, p50, p99, errors), (t, {name: rss})
    print(
        f"{args.model}: {args.clients} closed-loop clients for {args.minutes:g} min, a window every {args.every:g} s"
    )
    print(f"{'min':>5} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} {'tree RSS':>9}")
    try:
        end = begin + args.minutes * 60
        while time.monotonic() < end:
            w0 = time.monotonic()
            time.sleep(min(args.every, max(0.0, end - w0)))
            w1 = time.monotonic()
            lat = [d for t, d, s in list(done) if w0 <= t < w1 and s == 200]
            errors = sum(1 for t, _, s in list(done) if w0 <= t < w1 and s != 200)
            per = {}
            for pid in tree_pids(roots):
                got = rss_and_name(pid)
                if got:
                    per[got[1]] = per.get(got[1], 0) + got[0]
            p50 = statistics.median(lat) * 1e3 if lat else float("nan")
            p99 = float(np.percentile(lat, 99)) * 1e3 if lat else float("nan")
            windows.append((w1 - begin, len(lat) / (w1 - w0), p50, p99, errors))
            memory.append((w1 - begin, per))
            print(
                f"{(w1 - begin) / 60:5.1f} {len(lat) / (w1 - w0):7.1f} {p50:7.1f} {p99:7.1f} {errors:6d} "
                f"{human(sum(per.values())):>9}",
                flush=True,
            )
    finally:
        window = contention(before, sample(tree_pids(roots) + own))
        stop.set()
        for t in threads:
            t.join(30)
        server.stop()

    cut = args.warmup * 60
    kept = [(t, per) for t, per in memory if t >= cut]
    print(
        f"\nmemory per process after the first {args.warmup:g} min ({len(kept)} samples): start, end, growth per hour"
    )
    names = sorted({n for _, per in kept for n in per})
    for name in names:
        pts = [(t, per[name]) for t, per in kept if name in per]
        if not pts:
            continue
        growth = slope_per_hour([t for t, _ in pts], [v for _, v in pts])
        print(f"  {name:<48} {human(pts[0][1]):>9} {human(pts[-1][1]):>9} {growth / 2**20:+9.1f} MiB/h")
    tree = [(t, sum(per.values())) for t, per in kept]
    print(
        f"  {'the whole tree':<48} {human(tree[0][1]) if tree else '?':>9} {human(tree[-1][1]) if tree else '?':>9} "
        f"{slope_per_hour([t for t, _ in tree], [v for _, v in tree]) / 2**20:+9.1f} MiB/h"
    )
    late = [w for w in windows if w[0] >= cut]
    p99s = [w[3] for w in late]
    rate = statistics.mean([w[1] for w in late] or [0])
    print(
        f"p99 drift: {slope_per_hour([w[0] for w in late], p99s):+.1f} ms/h (p99 {min(p99s, default=0):.1f}-"
        f"{max(p99s, default=0):.1f} ms over the windows); throughput {rate:.1f} req/s; errors "
        f"{sum(w[4] for w in windows)}"
    )
    print(
        f"contention: {window.describe() if window else 'unknown'} (the server's tree and these clients are own work)"
    )


if __name__ == "__main__":
    main()
