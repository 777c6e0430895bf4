"""`vitdeploy rollout` under load: the p99 of the swap window against the steady p99, at half the server's capacity,
and the replicas the model serves with before and after a promotion.

Goals (issues 38, 48): under `vitdeploy loadtest` at half the server's capacity, during a promote and during a
rollback, 0 failed requests and the p99 of the swap window within 2x the steady p99 (--runs of each); after a
promotion the model serves with the replica count it had before.

Steps, on the demo model (exported once into the cache):

1. `vitdeploy serve -a DEMO -b ort` as a subprocess (--replicas, 2; runtime.threads 1), its Ray full: each replica
   takes the machine's cores / (replicas + 1) CPUs, so the cluster holds the live replicas and the candidate's one
   and no more, and a promotion steps the old version down as the new one grows (docs/serving.md);
2. capacity: the throughput of a closed loop of --clients clients (`loadtest`'s own loop), after a warm-up;
3. steady: an open loop (`loadtest --rate`) at half that capacity for --steady seconds: its p99;
4. promote: the same open loop, and after a few seconds `vitdeploy rollout` of a re-export of the same model
   (another manifest, the same files): it is shadowed, then promoted. The swap window runs from the moment
   unversioned traffic begins to move to the new version (on the full cluster: the first split of requests
   between the versions) to the end of the old one (drained and deleted): the p99 of the
   requests answered inside it, and of those answered while the candidate was shadowed;
5. rollback: the same with an export whose preprocessing differs (its manifest's normalisation mean changed): its
   answers are not its own export's eager answers, so it is rolled back at its check before any shadow (the
   window: from the decision to the candidate gone);
6. a kill at each phase (starting, shadow, promoting, draining, rolling-back; ``--kills``): the same open loop, and
   `vitdeploy rollout` (the command, ``--lease 5s``) held at the phase by its test-only hook
   (vitdeploy/client/rollout/hold.py), SIGKILLed there; once its lease expired, `rollout --status` converges
   (removes the candidate, or after the swap the old version). The failed requests of each phase's loop are counted.

Steps 4 and 5 run --runs times on the same server (each promote a new re-export). Every request of each open loop
is counted (errors must be 0); the model's RUNNING replicas (all its versions) are read before and after each
rollout. The machine's load average is printed before and after: on a shared machine the figures are as good as
its quiet.

    .venv/bin/python benchmarks/bench_rollout.py                       # ~12 min on 2 cores
    .venv/bin/python benchmarks/bench_rollout.py --kills none          # promote and rollback only, ~6 min
    .venv/bin/python benchmarks/bench_rollout.py --steady 30 --clients 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vitdeploy.base.machine import cpu_model  # noqa: E402
from vitdeploy.base.ray_join import init_ray  # noqa: E402

DEFAULT_CACHE = Path(os.environ.get("VITDEPLOY_BENCH_CACHE", "/tmp/vitdeploy-bench"))
NAME = "vit-demo-digits"
KILL_PHASES = ("starting", "shadow", "promoting", "draining", "rolling-back")
KILL_LEASE_S = 5.0


def loadavg() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def demo_export(cache: Path) -> Path:
    out = cache / "rollout-demo"
    if not (out / "manifest.json").exists():
        from vitdeploy.base.config import parse_config
        from vitdeploy.export.pipeline import run_export

        print(f"exporting the demo model into {out} ...", flush=True)
        export = {"int8": {"enabled": False}, "fp16": {"enabled": False}}
        run_export(parse_config({"export": export}), out, engine="skip")
    return out


def variant(source: Path, dest: Path, **preprocess: Any) -> Path:
    """A copy of the export with another manifest: a re-export (another ``created``), or with ``preprocess``
    values changed (a different preprocessing)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["created"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    manifest["preprocess"] = {**manifest["preprocess"], **preprocess}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dest


class Server:
    def __init__(self, artifacts: Path, config: Path, port: int) -> None:
        self.ray_tmp = tempfile.mkdtemp(prefix="vdbro", dir="/tmp")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_TMPDIR": self.ray_tmp, "RAY_USAGE_STATS_ENABLED": "0"}
        cmd = [sys.executable, "-m", "vitdeploy.cli", "serve", "-a", str(artifacts), "-b", "ort"]
        cmd += ["--port", str(port), "-c", str(config)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        self.lines: list[str] = []
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line.rstrip())
            if line.startswith("Ctrl-C"):
                break
        else:
            raise SystemExit("vitdeploy serve did not start:\n" + "\n".join(self.lines[-20:]))
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()  # type: ignore
        self.gcs = next(line.split()[2].rstrip(":") for line in self.lines if line.startswith("Ray at "))
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def p99(timeline: list[tuple[float, float]], start: float, end: float) -> tuple[float, int]:
    """The p99 latency (ms) of the requests answered in [start, end], and how many there were."""
    inside = [ms for at, ms in timeline if start <= at <= end]
    return (float(np.percentile(inside, 99)) if inside else float("nan")), len(inside)


def under_load(url: str, rate: float, seconds: float, action, images) -> tuple[Any, Any]:
    """``action()`` run a few seconds into an open loop at ``rate`` lasting ``seconds``; (its result, the level)."""
    from vitdeploy.client.loadgen import open_loop
    from vitdeploy.client.protocols import PREDICT, Target, open_client

    level: dict[str, Any] = {}
    target = Target(url, PREDICT)
    thread = threading.Thread(
        target=lambda: level.setdefault("r", open_loop(lambda: open_client(target), images, rate, seconds))
    )
    thread.start()
    time.sleep(4.0)
    outcome = action()
    thread.join()
    return outcome, level["r"]


def replicas() -> int:
    """The model's RUNNING replicas, all its versions together."""
    from vitdeploy.serve.rollout.candidate import replica_count, running_versions

    return sum(replica_count(app) for app in running_versions(NAME))


def rollout(server: Server, export: Path, cfg: Any, marks: dict[str, float]) -> Any:
    from vitdeploy.client.rollout.driver import RolloutPlan, run_rollout
    from vitdeploy.runtime.backends.base import BackendOptions

    def progress(line: str) -> None:
        marks.setdefault(line.split()[0], time.time())  # starting / shadowing / promoting / rolling
        print("  " + line, flush=True)

    plan = RolloutPlan(server.url, export, backend="ort", address=server.gcs, shadow_requests=200)
    return run_rollout(cfg, plan, BackendOptions(threads=1), progress)


def killed_at(server: Server, phase: str, export: Path, config: Path, work: Path) -> dict[str, Any]:
    """`vitdeploy rollout` of ``export`` held at ``phase`` (the test-only hook), SIGKILLed there; once its lease
    expired, `rollout --status` converges: what it removed, and the live version after."""
    import signal

    import ray

    from vitdeploy.client.rollout.hold import HOLD_ENV
    from vitdeploy.client.rollout.status import rollout_status
    from vitdeploy.serve.rollout.registry import registry_actor

    marker = work / f"held-{phase}.json"
    cmd = [sys.executable, "-m", "vitdeploy.cli", "rollout", server.url, "-a", str(export), "-b", "ort"]
    cmd += ["--address", server.gcs, "--shadow", "20", "--lease", f"{KILL_LEASE_S:g}s", "-c", str(config)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", HOLD_ENV: f"{phase}:{marker}"}
    with open(work / f"held-{phase}.stderr", "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    while not marker.exists():
        if proc.poll() is not None:
            raise SystemExit(f"the rollout never reached {phase}:\n" + (work / f"held-{phase}.stderr").read_text())
        time.sleep(0.05)
    held = json.loads(marker.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.time()
    while True:  # its lease runs out KILL_LEASE_S after its last renewal
        rollout = ray.get(registry_actor().status.remote())["models"][NAME]["rollout"]
        if rollout is None or rollout["lease_s"] <= 0:
            break
        time.sleep(0.1)
    status = rollout_status(server.gcs)
    return {
        "version": held["version"],
        "killed_at": killed,
        "converged": status.get("converged", []),
        "live": status["models"][NAME]["live"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from vitdeploy.base.config import parse_config
    from vitdeploy.client.loadgen import closed_loop
    from vitdeploy.client.loadtest import load_images
    from vitdeploy.serve.triton.local import free_port

    demo = demo_export(args.cache)
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    # the live replicas and one more fit, no more (whole ten-thousandths: Ray's unit of a resource, rounded down)
    cpus = int((os.cpu_count() or 1) / (args.replicas + 1) * 10_000) / 10_000
    serve = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "num_cpus_per_replica": cpus}
    serve.update(replicas=args.replicas, metrics_port=free_port())
    config = work / "serve.yaml"
    config.write_text("runtime: {threads: 1}\nserve: %s\n" % json.dumps(serve))
    cfg = parse_config({"runtime": {"threads": 1}, "serve": serve})
    images = load_images(None)
    out: dict[str, Any] = {"machine": cpu_model(), "cores": os.cpu_count(), "load_before": loadavg()}
    out.update(replicas=args.replicas, cpus_per_replica=cpus, promote=[], rollback=[])
    server = Server(demo, config, free_port())
    try:
        init_ray(ray, server.gcs, logging_level="WARNING", log_to_driver=False)
        from vitdeploy.client.protocols import PREDICT, Target, open_client

        factory = lambda: open_client(Target(server.url, PREDICT))  # noqa: E731
        closed_loop(factory, images, args.clients, duration_s=3.0)  # warm-up
        capacity = closed_loop(factory, images, args.clients, duration_s=args.capacity).throughput
        rate = capacity / 2
        out.update(capacity_rps=round(capacity, 1), rate_rps=round(rate, 1))
        print(f"capacity {capacity:.1f} req/s with {args.clients} clients: load at {rate:.1f} req/s", flush=True)
        from vitdeploy.client.loadgen import open_loop

        steady = open_loop(factory, images, rate, args.steady)
        out["steady"] = {"p99_ms": round(steady.percentile(99), 2), "requests": steady.sent, "errors": steady.errors}
        for i in range(args.runs):
            for name, export in (
                ("promote", variant(demo, work / f"reexport{i}")),
                ("rollback", variant(demo, work / f"preprocessing{i}", mean=[0.2, 0.2, 0.2])),
            ):
                print(f"{name} {i + 1}:", flush=True)
                out[name].append(measure(server, export, cfg, rate, args.swap, images))
        for phase in args.kills:
            export = variant(
                demo, work / f"kill-{phase}", **({"mean": [0.2, 0.2, 0.2]} if phase == "rolling-back" else {})
            )
            print(f"kill at {phase}:", flush=True)
            killed, level = under_load(
                server.url,
                rate,
                args.kill_swap,
                lambda p=phase, e=export: killed_at(server, p, e, config, work),
                images,
            )
            out.setdefault("kills", {})[phase] = {**killed, "requests": level.sent, "errors": level.errors}
    finally:
        ray.shutdown()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["load_after"] = loadavg()
    return out


def measure(server: Server, export: Path, cfg: Any, rate: float, seconds: float, images: Any) -> dict[str, Any]:
    """One rollout of ``export`` a few seconds into an open loop at ``rate``: its windows' p99, the replicas."""
    marks: dict[str, float] = {}
    before = replicas()
    result, level = under_load(server.url, rate, seconds, lambda: rollout(server, export, cfg, marks), images)
    swap = p99(level.timeline, *result.window)
    shadow = p99(level.timeline, marks.get("shadowing", 0), marks.get("promoting", marks.get("rolling", 0)))
    start = marks.get("shadowing", result.window[0])
    by_second = [
        (round(t - result.window[0], 1), *p99(level.timeline, t, t + 0.5))
        for t in np.arange(start - 1.0, result.window[1] + 3.0, 0.5)
    ]
    return {
        "p99_by_half_second": [(t, round(ms, 1), n) for t, ms, n in by_second],
        "verdict": result.verdict,
        "line": result.line(),
        "notes": result.notes,
        "replicas_before": before,
        "replicas_after": replicas(),
        "swap_s": round(result.window[1] - result.window[0], 2),
        "swap_p99_ms": round(swap[0], 2),
        "swap_requests": swap[1],
        "shadow_p99_ms": round(shadow[0], 2),
        "shadow_requests": shadow[1],
        "requests": level.sent,
        "errors": level.errors,
        "p99_ms": round(level.percentile(99), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients that measure the capacity")
    parser.add_argument("--capacity", type=float, default=10.0, help="seconds of the capacity measurement")
    parser.add_argument("--steady", type=float, default=20.0, help="seconds of the steady open loop")
    parser.add_argument("--swap", type=float, default=40.0, help="seconds of each open loop around a rollout")
    parser.add_argument("--kill-swap", type=float, default=40.0, help="seconds of each open loop around a kill")
    parser.add_argument(
        "--kills",
        default=",".join(KILL_PHASES),
        help="the phases a rollout is killed at, under load (comma-separated; 'none': no kill run)",
    )
    parser.add_argument("--replicas", type=int, default=2, help="the live version's replicas (the cluster: one more)")
    parser.add_argument("--runs", type=int, default=3, help="promotes and rollbacks, each")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()
    args.kills = [] if args.kills == "none" else [p.strip() for p in args.kills.split(",") if p.strip()]
    unknown = set(args.kills) - set(KILL_PHASES)
    if unknown:
        parser.error(f"--kills: {', '.join(sorted(unknown))}: the phases are {', '.join(KILL_PHASES)}")
    out = run(args)
    steady = out["steady"]["p99_ms"]
    print(f"\nmachine: {out['machine']}, {out['cores']} cores")
    print(f"load average {out['load_before']} before, {out['load_after']} after")
    print(f"{out['replicas']} replicas of {out['cpus_per_replica']:g} CPU (the cluster holds one more)")
    print(f"capacity {out['capacity_rps']} req/s; open loop at {out['rate_rps']} req/s; steady p99 {steady} ms")
    for name in ("promote", "rollback"):
        for i, r in enumerate(out[name], 1):
            ratio = r["swap_p99_ms"] / steady if steady else float("nan")
            print(
                f"{name:<8} {i} {r['verdict']:<12} swap {r['swap_s']} s: p99 {r['swap_p99_ms']} ms over "
                f"{r['swap_requests']} requests ({ratio:.2f}x steady); shadow p99 {r['shadow_p99_ms']} ms; "
                f"{r['requests']} requests, errors {r['errors'] or 0}; replicas {r['replicas_before']} before, "
                f"{r['replicas_after']} after"
            )
    for phase, k in out.get("kills", {}).items():
        converged = "; ".join(k["converged"]) or "nothing to converge"
        print(
            f"kill at {phase:<12} {k['requests']} requests, errors {k['errors'] or 0}; then {converged}; "
            f"live v{k['live']}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
