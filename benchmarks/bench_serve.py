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
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vitdeploy.base.machine import cpu_model  # noqa: E402
from vitdeploy.evaluate import reliability  # noqa: E402

if TYPE_CHECKING:
    from helpers.certs import Certs

TARGET = 0.9
DEFAULT_CACHE = Path(os.environ.get("VITDEPLOY_BENCH_CACHE", "/tmp/vitdeploy-bench"))


def loadavg() -> str:
    """The load average, printed for reference only: contention is judged by :func:`measure_contention`."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def tree_pids(roots: list[int]) -> list[int]:
    """``roots`` and all their descendants (a server and the Ray processes it started)."""
    return list(cpu_seconds(roots))


# --------------------------------------------------------------------------------------------- inputs


def photos() -> list[bytes]:
    """Real photographs bundled with scikit-image, as JPEG (quality 90)."""
    from PIL import Image
    from skimage import data

    out = []
    for name in ("astronaut", "coffee", "chelsea", "camera", "rocket", "immunohistochemistry"):
        buf = io.BytesIO()
        Image.fromarray(getattr(data, name)()).convert("RGB").save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def demo_digits() -> list[bytes]:
    """The demo model's own inputs: the digit images shipped in vitdeploy/demo/images (PNG and JPEG, ~1.5 kB)."""
    from vitdeploy.demo import IMAGES_DIR

    return [p.read_bytes() for p in sorted(IMAGES_DIR.iterdir()) if p.suffix in (".png", ".jpg")]


def demo_artifacts(cache: Path) -> Path:
    out = cache / "demo-artifacts"
    if not (out / "manifest.json").is_file():
        from vitdeploy.base.config import parse_config
        from vitdeploy.export.pipeline import run_export

        print(f"exporting the demo model into {out} ...", flush=True)
        run_export(parse_config({}), out, engine="skip")
    return out


def vit_small_artifacts(cache: Path) -> Path:
    """A ViT-S/16 224 with random weights: transformers' ViTForImageClassification, saved with
    save_pretrained, exported by `vitdeploy export` (FP32 ONNX + ORT graph)."""
    out = cache / "vit-s16-hf-random-art"
    if (out / "manifest.json").is_file():
        return out
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    ckpt = cache / "vit-s16-hf-random"
    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
        image_size=224,
        patch_size=16,
        num_labels=1000,
    )
    ViTForImageClassification(config).eval().save_pretrained(ckpt)
    print(f"exporting a random-weight ViT-S/16 into {out} ...", flush=True)
    run_export(
        parse_config(
            {
                "model": {"checkpoint": str(ckpt)},
                "export": {"fp16": {"enabled": False}},
                "validation": {"max_images": 8, "noise_samples": 2},
            }
        ),
        out,
        engine="skip",
    )
    return out


# --------------------------------------------------------------------------------------------- server


class Server:
    """`vitdeploy serve` in a subprocess, stopped with SIGTERM."""

    def __init__(
        self,
        artifacts: Path,
        threads: int,
        max_batch: int,
        wait_ms: float,
        decode_threads: int,
        port: int,
        metrics_port: int,
        concurrent_batches: int = 2,
        server_threads: int | None = None,
        stage_timing: bool = True,
        tls: "Certs | None" = None,
        token: str | None = None,
    ) -> None:
        """``tls``: serve HTTPS with that certificate (:func:`certificate`); ``token``: every model route needs
        it (``VITDEPLOY_SERVE_TOKEN``; :func:`client` sends it)."""
        self.cfg = Path(tempfile.mkdtemp(prefix="bench-serve-")) / "pipeline.yaml"
        https = f", tls: {{certfile: {json.dumps(str(tls.cert))}, keyfile: {json.dumps(str(tls.key))}}}" if tls else ""
        self.cfg.write_text(
            # the replica gets the in-process side's cores (num_cpus_per_replica) and splits them among its
            # concurrent model calls itself (ray_app.ReplicaSpec.threads); --server-threads forces runtime.threads
            (f"runtime: {{threads: {server_threads}}}\n" if server_threads else "")
            + f"serve: {{max_batch_size: {max_batch}, batch_wait_timeout_s: {wait_ms / 1000}, "
            f"num_cpus_per_replica: {threads}, "
            f"decode_threads: {decode_threads}, concurrent_batches: {concurrent_batches}, "
            f"max_ongoing_requests: {max(64, max_batch * concurrent_batches)}, "
            f"stage_timing: {str(stage_timing).lower()}, metrics_port: {metrics_port}{https}}}\n"
        )
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.token = token
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        if token:
            from vitdeploy.serve.auth import TOKEN_ENV

            env[TOKEN_ENV] = token
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vitdeploy.cli",
                "serve",
                "-a",
                str(artifacts),
                "-b",
                "ort",
                "--port",
                str(port),
                "-c",
                str(self.cfg),
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for line in self.proc.stderr:  # type: ignore[union-attr]
            if line.startswith(("ready:", "error:")):
                print("  serve " + line.strip(), flush=True)
            if line.startswith("Ctrl-C") or line.startswith("error:"):
                break
        if self.proc.poll() is not None:
            raise SystemExit("vitdeploy serve did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        deadline = time.monotonic() + 120  # the metrics agent may come up after the app
        while True:
            try:
                self.batches()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def batches(self) -> float:
        """How many batches the batch handler has run (``ray_serve_actual_batch_size_count``, all replicas)."""
        import httpx

        try:
            text = httpx.get(self.metrics_url, timeout=10).text
        except httpx.HTTPError as exc:
            raise OSError(f"metrics endpoint {self.metrics_url}: {exc}") from exc
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("ray_serve_actual_batch_size_count")
        )

    def settled_batches(self, quiet_s: float = 6.0, timeout_s: float = 90.0) -> float:
        """The batch count once Ray's metrics export has caught up (unchanged for ``quiet_s``)."""
        deadline = time.monotonic() + timeout_s
        last = self.batches()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.batches()
            if now == last:
                return now
            last = now
        return last

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


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


def client(url: str, token: str | None = None):
    """One keep-alive connection POSTing images to ``url``/predict: `vitdeploy loadtest`'s own client (the echo
    app's route prefix "/" takes /predict too); ``token``: the bearer token it sends."""
    from vitdeploy.client.protocols import PREDICT, Target, open_client

    return open_client(Target(url, PREDICT, token=token))


def certificate(folder: Path) -> "Certs":
    """A CA and a server certificate for 127.0.0.1 it signs, made in ``folder`` (the tests' own maker,
    tests/helpers/certs.py); this process's HTTPS clients trust that CA from now on (``SSL_CERT_FILE``: the
    standard library's default context, which `vitdeploy loadtest`'s clients use, reads it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.certs import make_certs

    certs = make_certs(folder)
    os.environ["SSL_CERT_FILE"] = str(certs.ca)
    return certs


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------- timing


def concurrent(
    call: Callable[[bytes, object], None],
    images: list[bytes],
    clients: int,
    session: Callable[[], object] | None = None,
) -> tuple[float, list[float]]:
    """Send ``images`` (one per call) from ``clients`` threads; (images/s, per-call latencies s)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        ctx = session() if session else None
        mine = []
        for blob in images[k::clients]:
            t0 = time.perf_counter()
            call(blob, ctx)
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    return len(images) / (time.perf_counter() - start), latencies


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{min(values):.3g}-{max(values):.3g} ({(max(values) - min(values)) / med * 100 if med else 0:.0f}%)"


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


def cpu_seconds(pids: list[int]) -> dict[int, tuple[str, float]]:
    """{pid: (command, user+system CPU seconds)} for ``pids`` and all their descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            fields = rest.split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), cmd, (int(fields[11]) + int(fields[12])) / tick)
    keep, frontier = set(pids), list(pids)
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in stats.items():
            if ppid == parent and pid not in keep:
                keep.add(pid)
                frontier.append(pid)
    return {pid: stats[pid][1:] for pid in keep if pid in stats}


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


def in_process_variants(
    predictor, work: list[bytes], args: argparse.Namespace
) -> dict[str, Callable[[], tuple[float, list[float]]]]:
    """The two in-process baselines (warmed up): one image per call from each client thread, and
    batches of ``--max-batch``; each returns (images/s, per-image latencies in s)."""

    def in_process(blob: bytes, _: object) -> None:
        predictor.predict(blob)

    def batched() -> tuple[float, list[float]]:
        lat = []
        start = time.perf_counter()
        for i in range(0, len(work), args.max_batch):
            t0 = time.perf_counter()
            chunk = work[i : i + args.max_batch]
            predictor.predict(chunk)
            lat.extend([time.perf_counter() - t0] * len(chunk))
        return len(work) / (time.perf_counter() - start), lat

    concurrent(in_process, work[: args.clients], args.clients)  # warm-up
    return {"in-process, 1/call": lambda: concurrent(in_process, work, args.clients), "in-process, batched": batched}


def compare_rounds(
    served: str,
    variants: dict[str, Callable[[], tuple[float, list[float]]]],
    rounds: int,
    *,
    probe: Callable[[], Any],
    mean_batch: Callable[[Any, Any], float],
    floor: str | None = None,
    own_pids: Callable[[], list[int]] | None = None,
) -> dict[str, object]:
    """Run every variant once per round, the order rotating; ``served`` is the server variant, whose
    dynamic batch size ``mean_batch(probe() before, probe() after)`` gives; ``floor`` (optional) a
    bare server (not an in-process variant) whose req/s ``served`` is also compared with. Each round's
    contention is measured (``own_pids()``: the servers' process trees, counted as the benchmark's
    own). Prints each round, then images/s (median, spread), p50/p99 and served / best in-process;
    flags an unreliable ratio (other work competed for the cores in a round, or a wide spread)."""
    rates: dict[str, list[float]] = {k: [] for k in variants}
    lats: dict[str, list[float]] = {k: [] for k in variants}
    ratios: list[float] = []
    floor_ratios: list[float] = []
    batch_means: list[float] = []
    busy: list[str] = []
    competing: list[float] = []
    names = list(variants)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        got = {}
        start = reliability.sample(own_pids() if own_pids else ())
        for name in order:
            before = probe() if name == served else None
            rate, lat = variants[name]()
            got[name] = rate
            rates[name].append(rate)
            lats[name].extend(lat)
            if name == served:
                batch_means.append(mean_batch(before, probe()))
        window = reliability.contention(start, reliability.sample(own_pids() if own_pids else ()))
        why = reliability.busy_machine_reason(window, None)  # the servers use every core
        if why:
            busy.append(f"round {r + 1}: {why}")
        if window is not None:
            competing.append(window.competing_cores)
        ratios.append(got[served] / max(v for k, v in got.items() if k not in (served, floor)))
        if floor:
            floor_ratios.append(got[served] / got[floor])
        print(
            f"  round {r + 1}: "
            + ", ".join(f"{k} {v:.1f} img/s" for k, v in got.items())
            + f"; {served}/best in-process {ratios[-1]:.2f}"
            + (f"; {served}/{floor} {floor_ratios[-1]:.2f}" if floor else "")
            + f"; mean batch {batch_means[-1]:.1f}; contention: "
            + (window.describe() if window else "unknown (no /proc)"),
            flush=True,
        )
    print(f"  {'variant':<22} {'img/s (median)':>14}  {'spread over rounds':<24} {'p50 ms':>8} {'p99 ms':>8}")
    for name in names:
        print(
            f"  {name:<22} {statistics.median(rates[name]):>14.1f}  {spread(rates[name]):<24} "
            f"{pct(lats[name], 50):>8.1f} {pct(lats[name], 99):>8.1f}"
        )
    ratio = statistics.median(ratios)
    print(
        f"  {served} / best in-process: {ratio:.2f} (spread {spread(ratios)}); mean dynamic batch size "
        f"{statistics.median(batch_means):.1f} (spread {spread(batch_means)}); competing cores per round "
        + (", ".join(f"{c:.2f}" for c in competing) or "unknown")
    )
    if floor:
        print(f"  {served} / {floor} (req/s): {statistics.median(floor_ratios):.2f} (spread {spread(floor_ratios)})")
    wide = (max(ratios) - min(ratios)) > 0.15 * ratio
    for why in busy + ([f"the ratio's spread over rounds is {spread(ratios)}"] if wide else []):
        print(f"  ! unreliable: {why}", flush=True)
    return {
        "ratio": ratio,
        "batch": statistics.median(batch_means),
        "unreliable": bool(busy) or wide,
        "floor_ratio": statistics.median(floor_ratios) if floor else None,
        "competing_cores": competing,
    }


def run_models(served: str, args: argparse.Namespace, versions: str, bench_model: Callable[..., dict]) -> None:
    """Print the machine, then ``bench_model`` on each of ``--models`` (same JPEG photos), then the
    verdict on the ViT-S/16 target."""
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}; date: {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"cpu: {cpu_model()} ({os.cpu_count()} logical CPUs); {versions}")
    args.cache.mkdir(parents=True, exist_ok=True)
    images = photos()
    print(f"images: {len(images)} JPEG photos, {min(map(len, images)) // 1024}-{max(map(len, images)) // 1024} KB")
    if args.demo_bodies == "digits":  # the demo model's own inputs: what it costs to serve, not to decode photos
        digits = demo_digits()
        print(f"demo model bodies: its {len(digits)} digit images ({min(map(len, digits))}-{max(map(len, digits))} B)")
    results = {}
    for model in args.models.split(","):
        if model == "vit-s16":
            results[model] = bench_model("ViT-S/16 224, random weights", vit_small_artifacts(args.cache), args, images)
        elif model == "demo":
            bodies = demo_digits() if args.demo_bodies == "digits" else images
            results[model] = bench_model("demo model (32 px)", demo_artifacts(args.cache), args, bodies)
        else:
            raise SystemExit(f"unknown model {model!r} (vit-s16, demo)")
    if "ratio" in results.get("vit-s16", {}):
        r = results["vit-s16"]
        verdict = "MET" if r["ratio"] >= TARGET else "NOT MET"
        print(
            f"\ntarget {served} >= {TARGET}x in-process for ViT-S/16: {r['ratio']:.2f} -> {verdict}"
            + (" (unreliable: see above)" if r["unreliable"] else "")
        )


def common_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments both serving benchmarks take."""
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="ONNX Runtime intra-op threads, both sides"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=192, help="requests per round for the ViT-S/16")
    ap.add_argument("--requests-demo", type=int, default=960, help="requests per round for the demo model")
    ap.add_argument("--wait-ms", type=float, default=10.0, help="the server's batching wait in ms")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--models", default="vit-s16,demo", help="comma-separated: vit-s16, demo")
    ap.add_argument(
        "--demo-bodies",
        choices=("photos", "digits"),
        default="photos",
        help="what the demo model is sent: the JPEG photos (decoding a 512 px photo for a 32 px model costs more "
        "than Ray Serve's own floor here) or its own digit images (what serving it costs)",
    )


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
