"""`vitdeploy serve` (Ray Serve) against the in-process Predictor: 16 concurrent clients, one JPEG each.

Target: for a ViT-S/16 (random weights) the server's throughput is >= 0.9x the in-process
Predictor's on the same artifacts and the same ONNX Runtime threads; reported for the demo model.
Also reported: the mean dynamic batch size (Ray Serve's own ``ray_serve_actual_batch_size``
histogram, read from the Prometheus endpoint; expect >= 4) and p50/p99 latency.

Variants, measured in rounds whose order rotates, all with ``--clients`` concurrent callers sending
the same real photographs (scikit-image's bundled ones, saved as JPEG), one image per request:

* ``in-process, 1/call``  the Predictor in this process, ``predict(jpeg_bytes)`` from each client
                          thread (decode + model call per image, no batching);
* ``in-process, batched`` the Predictor in this process over the same images in batches of
                          ``serve.max_batch_size`` (the best an offline loop gets: no HTTP, no queue);
* ``serve``               ``vitdeploy serve`` as a subprocess (local Ray), keep-alive HTTP clients POSTing
                          ``/predict``; its replica runs the same artifacts with the same threads;
* ``bare Ray Serve``      Ray Serve's floor, in the same rounds: a bare echo deployment (no model, no
                          vitdeploy code: the body read and a short JSON answer) in its own local Ray,
                          same clients, same bodies. ``serve / bare`` (req/s) and the CPU per request of
                          each server's process tree say what vitdeploy adds over Ray Serve itself.

The ratio is taken against the faster in-process variant of the same round, then the median over
rounds is printed with its spread (min-max). Each round's contention is measured
(``vitdeploy.evaluate.reliability``: the machine's busy CPU from /proc/stat less this process and
the servers' process trees, plus steal); a ratio is flagged when other work competed for the cores
or the spread is wide.

``--compare stage-timing,https`` measures instead (or as well, with ``in-process``) what a server feature
costs: `vitdeploy serve` with ``serve.stage_timing`` on against off, and over HTTPS against HTTP, every server
started the same way and measured in the same interleaved rounds (benchmarks/_serve_ab.py).

    .venv/bin/python benchmarks/bench_serve.py                       # demo + ViT-S/16 (exported once)
    .venv/bin/python benchmarks/bench_serve.py --rounds 5 --threads 4
    .venv/bin/python benchmarks/bench_serve.py --compare stage-timing,https --models demo --demo-bodies digits
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from _serve_kit import (
    Server,
    client,
    common_arguments,
    compare_rounds,
    concurrent,
    cpu_seconds,
    free_port,
    in_process_variants,
    run_models,
    tree_pids,
)

ECHO_APP = "bare-echo"


def echo_server_main(port: int) -> None:
    """``bench_serve.py --echo-server PORT``: a bare Ray Serve app, no vitdeploy code in its path: one
    echo deployment that reads the body and answers a short JSON (the size of one /predict record),
    in its own local Ray at the same worker priority as `vitdeploy serve`; stops on SIGTERM."""
    from vitdeploy.base.ray_private import WORKER_NICENESS_ENV, local_ray_options

    os.environ.setdefault(WORKER_NICENESS_ENV.variable, "0")  # as `vitdeploy serve` starts its local Ray
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(max_ongoing_requests=64)
    class Echo:
        async def __call__(self, request: Request) -> JSONResponse:
            body = await request.body()
            return JSONResponse([{"path": "image", "bytes": len(body), "label": "echo", "index": 0, "score": 1.0}])

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    loopback = local_ray_options(None, loopback=True)  # Ray's private keywords: vitdeploy/base/ray_private.py
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING", **loopback)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
    serve.run(Echo.bind(), name=ECHO_APP, route_prefix="/", logging_config={"log_level": "WARNING"})
    print("Ctrl-C", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # ray.init installed its own
    while not stop.wait(0.5):
        pass
    ray.shutdown()  # with every process of this local Ray


class EchoServer:
    """The bare Ray Serve app of :func:`echo_server_main` in a subprocess."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--echo-server", str(port)], stderr=subprocess.PIPE, text=True, env=env
        )
        lines = []
        for line in self.proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        if self.proc.poll() is not None:
            raise SystemExit("the bare Ray Serve app did not start:\n" + "".join(lines[-20:]))
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        deadline = time.monotonic() + 60  # the proxy may answer a moment after the app is RUNNING
        while True:
            try:
                if client(self.url).send(b"x")[0] == "200":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("the bare Ray Serve app does not answer on " + self.url)
            time.sleep(0.5)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


def bench_model(label: str, artifacts: Path, args: argparse.Namespace, images: list[bytes]) -> dict[str, object]:
    from vitdeploy.runtime.backends.base import BackendOptions
    from vitdeploy.runtime.predictor import Predictor

    n = args.requests_demo if "demo" in label else args.requests
    work = [images[i % len(images)] for i in range(n)]
    print(
        f"\n== {label}: {n} requests x {args.rounds} rounds, {args.clients} clients, {args.threads} ORT threads",
        flush=True,
    )
    predictor = Predictor.from_artifacts(artifacts, backend="ort", options=BackendOptions(threads=args.threads))
    server = Server(
        artifacts,
        args.threads,
        args.max_batch,
        args.wait_ms,
        args.decode_threads,
        free_port(),
        free_port(),
        args.concurrent_batches,
        args.server_threads,
        args.stage_timing,
    )
    echo = EchoServer(free_port()) if args.bare else None
    try:
        return _measure(server, predictor, work, args, echo)
    finally:
        rc = server.stop()
        if echo is not None:
            echo.stop()
        predictor.close()
        print(f"  server exit code {rc}", flush=True)


def cpu_by_role(
    root: int, before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two :func:`cpu_seconds` samples, by role (replica, proxy, other Ray)."""
    roles: dict[str, float] = {}
    for pid, (cmd, secs) in after.items():
        spent = secs - before.get(pid, (cmd, 0.0))[1]
        role = (
            "replica"
            if "ServeReplica" in cmd
            else "proxy"
            if "ProxyActor" in cmd
            else "serve CLI"
            if pid == root
            else "other Ray"
        )
        roles[role] = roles.get(role, 0.0) + spent
    return roles


def _measure(
    server: Server, predictor, work: list[bytes], args: argparse.Namespace, echo: EchoServer | None = None
) -> dict[str, object]:
    failures: list[str] = []
    spent: dict[str, float] = {}
    bare_spent: dict[str, float] = {}

    def post(blob: bytes, connection: object) -> None:
        status, example = connection.send(blob)  # type: ignore[attr-defined]
        if status != "200":
            failures.append(f"{status}: {example[:200]}")

    def over_http(root: int, url: str, into: dict[str, float]) -> Callable[[], tuple[float, list[float]]]:
        def run() -> tuple[float, list[float]]:
            before, client_before = cpu_seconds([root]), time.process_time()
            out = concurrent(post, work, args.clients, lambda: client(url))
            for role, secs in {
                **cpu_by_role(root, before, cpu_seconds([root])),
                "clients (this process)": time.process_time() - client_before,
            }.items():
                into[role] = into.get(role, 0.0) + secs
            return out

        return run

    def timed_in_process(
        variant: Callable[[], tuple[float, list[float]]], name: str
    ) -> Callable[[], tuple[float, list[float]]]:
        def run() -> tuple[float, list[float]]:
            start = time.process_time()
            out = variant()
            spent[name] = spent.get(name, 0.0) + time.process_time() - start
            return out

        return run

    variants = {name: timed_in_process(v, name) for name, v in in_process_variants(predictor, work, args).items()}
    variants["serve"] = over_http(server.proc.pid, server.url, spent)
    concurrent(post, work[: args.clients * 2], args.clients, lambda: client(server.url))  # warm-up
    roots = [server.proc.pid]
    if echo is not None:
        variants[BARE] = over_http(echo.proc.pid, echo.url, bare_spent)
        concurrent(post, work[: args.clients * 2], args.clients, lambda: client(echo.url))  # warm-up
        roots.append(echo.proc.pid)
    result = compare_rounds(
        "serve",
        variants,
        args.rounds,
        probe=server.settled_batches,
        mean_batch=lambda before, after: len(work) / max(after - before, 1.0),
        floor=BARE if echo is not None else None,
        own_pids=lambda: tree_pids(roots),
    )
    per_image = 1000.0 / (len(work) * args.rounds)
    print(
        "  CPU per image (ms of one core): "
        + ", ".join(f"{role} {secs * per_image:.1f}" for role, secs in sorted(spent.items(), key=lambda kv: -kv[1]))
    )
    if echo is not None:
        ours = sum(v for k, v in spent.items() if k in SERVER_ROLES) * per_image
        floor = sum(v for k, v in bare_spent.items() if k in SERVER_ROLES) * per_image
        print(
            "  bare Ray Serve, CPU per request (ms of one core): "
            + ", ".join(
                f"{role} {secs * per_image:.1f}" for role, secs in sorted(bare_spent.items(), key=lambda kv: -kv[1])
            )
        )
        model = min(v for k, v in spent.items() if k.startswith("in-process")) * per_image  # decode + model
        print(
            f"  server CPU per request: vitdeploy serve {ours:.2f} ms, bare Ray Serve {floor:.2f} ms; beyond the "
            f"in-process work (decode + model, {model:.2f} ms) vitdeploy serve spends {ours - model:.2f} ms, "
            f"{(ours - model) / floor if floor else float('nan'):.2f}x Ray Serve's own floor"
        )
        result["cpu_ms"] = {"serve": ours, "bare": floor, "in_process": model}
    print(f"  failed requests {len(failures)}" + (f" (first: {failures[0]})" if failures else ""))
    return result


BARE = "bare Ray Serve"
SERVER_ROLES = ("replica", "proxy", "other Ray", "serve CLI")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_arguments(ap)
    ap.add_argument("--max-batch", type=int, default=16, help="serve.max_batch_size (and the in-process batch)")
    ap.add_argument("--decode-threads", type=int, default=4, help="serve.decode_threads (its default)")
    ap.add_argument("--concurrent-batches", type=int, default=2, help="serve.concurrent_batches (its default)")
    ap.add_argument(
        "--server-threads",
        type=int,
        default=None,
        help="runtime.threads of the server (default: unset, the replica splits --threads cores "
        "among its concurrent batches)",
    )
    ap.add_argument(
        "--no-stage-timing",
        dest="stage_timing",
        action="store_false",
        help="serve.stage_timing: false (no Server-Timing header, no stage histograms): the baseline of its cost",
    )
    ap.add_argument(
        "--no-bare",
        dest="bare",
        action="store_false",
        help="leave out the bare Ray Serve echo app (Ray Serve's own floor)",
    )
    ap.add_argument(
        "--compare",
        default="in-process",
        type=lambda text: [w.strip() for w in text.split(",") if w.strip()],
        help="comma-separated, what to measure: in-process (serve against the in-process Predictor and bare Ray "
        "Serve; the default), stage-timing (serve with serve.stage_timing on against off), https (serve over "
        "HTTPS against HTTP); stage-timing and https run side by side in the same rounds (benchmarks/_serve_ab.py)",
    )
    ap.add_argument("--echo-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        echo_server_main(args.echo_server)
        return
    unknown = [c for c in args.compare if c not in ("in-process", "stage-timing", "https")]
    if unknown or not args.compare:
        ap.error(f"--compare {','.join(unknown)!r}: expected in-process, stage-timing and/or https")

    import onnxruntime
    import ray

    run_models("serve", args, f"onnxruntime {onnxruntime.__version__}, ray {ray.__version__}", bench_chosen)


def bench_chosen(label: str, artifacts: Path, args: argparse.Namespace, images: list[bytes]) -> dict[str, object]:
    """What ``--compare`` names on one model: the in-process comparison, then the server-against-server ones."""
    result: dict[str, object] = {}
    if "in-process" in args.compare:
        result.update(bench_model(label, artifacts, args, images))
    if {"stage-timing", "https"} & set(args.compare):
        from _serve_ab import ab_model

        result.update(ab_model(label, artifacts, args, images))
    return result


if __name__ == "__main__":
    main()
