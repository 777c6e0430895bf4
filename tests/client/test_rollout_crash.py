"""`vitdeploy rollout` killed at each of its phases, under load: SIGKILL (Ctrl-C, SIGTERM) of the command while HTTP
/predict, v2 HTTP and v2 gRPC clients send requests and every answer is counted. Not one request fails, every
answer comes from the live version (or, once it was promoted, the new one), `rollout --status` converges to one
clean state, and the next rollout converges what was left - the candidate that never went live removed, the live
version never - and completes a rollout of its own.

Deterministic: the command is held at the phase by its test hook (vitdeploy/client/rollout/hold.py: it writes a
marker file and waits there, its lease renewed) and killed once the marker is there; its lease is 2 s
(``--lease``), so the next rollout waits for nothing but that. One `vitdeploy serve` (a tiny export, one replica)
for the module, with Ray's defaults (token authentication on); the candidates are the live model's other seed (so
an answer from a version that must not answer is seen in its label), or an export whose preprocessing was edited
for the phase rolling back.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy rollout needs ray[serve] (pip install 'vitdeploy[serve]')")
pytest.importorskip("tritonclient.grpc", reason="the gRPC client needs tritonclient[grpc]")

from helpers.counted_load import CountedLoad, failures, random_pngs  # noqa: E402
from helpers.held import processes  # noqa: E402
from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess, free_port, leave_ray, serve_env  # noqa: E402
from helpers.tiny_export import PREPROCESS  # noqa: E402

from vitdeploy.base.config import parse_config  # noqa: E402
from vitdeploy.base.ray_join import init_ray  # noqa: E402
from vitdeploy.client.rollout.driver import RolloutPlan, run_rollout  # noqa: E402
from vitdeploy.client.rollout.hold import HOLD_ENV  # noqa: E402
from vitdeploy.client.rollout.status import format_status, rollout_status  # noqa: E402
from vitdeploy.runtime.backends.base import BackendOptions  # noqa: E402
from vitdeploy.serve.rollout.registry import (  # noqa: E402
    DRAINING,
    PROMOTED,
    PROMOTING,
    ROLLED_BACK,
    ROLLING_BACK,
    SHADOW,
    STARTING,
    registry_actor,
)
from vitdeploy.serve.rollout.routes import version_app  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "tiny"
LEASE_S = 2.0  # the rollouts' lease here (--lease): the next one takes an abandoned one over this long after
HANG_S = 180.0  # only a guard against a hang: every wait below ends on an event
SERVE = {
    "max_batch_size": 4,
    "batch_wait_timeout_s": 0.002,
    "decode_threads": 1,
    "num_cpus_per_replica": 1,
    "graceful_shutdown_timeout_s": 5,
    "request_timeout_s": 3,
}


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return random_pngs(6)


@pytest.fixture(scope="module")
def labels(tiny_artifacts, images) -> dict[int, list[str]]:
    """Each seed's top-1 label of each image (the in-process Predictor): the two models answer differently."""
    from vitdeploy.runtime.predictor import Predictor

    out = {}
    for seed in (0, 1):
        with Predictor.from_artifacts(tiny_artifacts(seed=seed), backend="ort") as predictor:
            out[seed] = [p.label for p in predictor.predict(images, top_k=1)]
    assert out[0] != out[1], "the two seeds must answer differently"
    return out


@pytest.fixture(scope="module")
def server(tiny_artifacts, images, tmp_path_factory):
    """`vitdeploy serve` of the tiny export (seed 0), this process joined to its Ray, and the exports to roll out:
    each seed (``exports[seed]``) and an edited one (``exports["edited"]``: rolled back at its check)."""
    import ray

    folder = tmp_path_factory.mktemp("crash")
    (folder / "images").mkdir()  # the exports' validation images: the faithfulness check sends them
    for seed, blob in enumerate(images):
        (folder / "images" / f"{seed}.png").write_bytes(blob)
    grpc_port = free_port()
    cfg = folder / "serve.yaml"
    cfg.write_text("runtime: {threads: 1}\nserve: %s\n" % json.dumps({**SERVE, "grpc_port": grpc_port}))
    (folder / "rollout.yaml").write_text(
        "runtime: {threads: 1}\nserve: %s\nvalidation: {images: %s}\n" % (json.dumps(SERVE), folder / "images")
    )
    exports = {seed: _copy(tiny_artifacts(seed=seed), folder / f"seed{seed}") for seed in (0, 1)}
    edited = {**PREPROCESS, "mean": [0.2, 0.2, 0.2]}
    exports["edited"] = _copy(tiny_artifacts(seed=1), folder / "edited", preprocess=edited)
    ray_tmp = Path(tempfile.mkdtemp(prefix="vdcrash", dir="/tmp"))  # short: Ray's socket paths have a length limit
    proc = ServeProcess(tiny_artifacts(seed=0), cfg, *GRPC_WITHOUT_TOKEN, env={"RAY_TMPDIR": str(ray_tmp)})
    try:
        gcs = next(line.split()[2].rstrip(":") for line in proc.lines if line.startswith("Ray at "))
        init_ray(ray, gcs, logging_level="WARNING")
        yield {"url": proc.url, "grpc": f"127.0.0.1:{grpc_port}", "gcs": gcs, "folder": folder, "exports": exports}
    finally:
        leave_ray()
        assert proc.stop() == 0, "\n".join(proc.lines[-20:])
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _copy(source: Path, dest: Path, **changes) -> Path:
    """A copy of an export with another manifest (another export sha); ``changes`` replace manifest keys."""
    shutil.copytree(source, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest.update(created="2025-03-03T00:00:00+00:00", **changes)
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dest


SEEDS: dict[int, int] = {1: 0}  # the seed of each version started here (v1: what `serve` runs)


def _registry_state() -> dict:
    import ray

    registry = registry_actor()
    state = ray.get(registry.status.remote())["models"].get(MODEL) if registry is not None else None
    return state or {"live": 1, "versions": {"1": {"state": "live"}}, "rollout": None}


def _held_rollout(server, export: Path, phase: str, marker: Path) -> tuple[subprocess.Popen, dict, Path]:
    """`vitdeploy rollout` (the command, as docs/serving.md prints it, with a 2 s lease) held at ``phase``: the
    process, what its marker says (its pid, the candidate's version, the live one), its stderr's file."""
    args = ["-a", str(export), "-b", "ort", "--address", server["gcs"], "--shadow", "4", "--lease", f"{LEASE_S:g}s"]
    args += ["--start-timeout", "120s", "-c", str(server["folder"] / "rollout.yaml")]
    err = marker.with_suffix(".stderr")
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vitdeploy.cli", "rollout", server["url"], *args],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**serve_env(), HOLD_ENV: f"{phase}:{marker}"},
        )
    deadline = time.monotonic() + HANG_S
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the rollout never reached {phase} (exit {proc.wait()}):\n{err.read_text()[-3000:]}")
        time.sleep(0.05)
    return proc, json.loads(marker.read_text()), err


def _lease_expired() -> None:
    """Until the model's rollout lease expired (or no rollout holds it): 2 s after the process stopped renewing."""
    deadline = time.monotonic() + HANG_S
    while True:
        rollout = _registry_state()["rollout"]
        if rollout is None or rollout["lease_s"] <= 0:
            return
        assert time.monotonic() < deadline, rollout
        time.sleep(0.1)


def _next_rollout(server, export: Path) -> tuple:
    cfg = parse_config(
        {"runtime": {"threads": 1}, "serve": SERVE, "validation": {"images": str(server["folder"] / "images")}}
    )
    plan = RolloutPlan(
        server["url"], export, backend="ort", shadow_requests=4, timeout_s=120, start_timeout_s=120, lease_s=LEASE_S
    )
    lines: list[str] = []
    return run_rollout(cfg, plan, BackendOptions(threads=1), lines.append), lines


def _replicas(version: int) -> list[int]:
    return sorted(processes(f"ServeReplica:{version_app(MODEL, version)}:"))


def _applications() -> set[str]:
    from ray import serve

    return set(serve.status().applications)


#: (the phase it is held at, the signal, what converges after it: `rollout --status`, or the next rollout)
CASES = [
    (STARTING, signal.SIGKILL, "status"),
    (SHADOW, signal.SIGKILL, "rollout"),
    (PROMOTING, signal.SIGKILL, "status"),
    (PROMOTING, signal.SIGINT, "status"),  # Ctrl-C before the swap: rolled back by the command itself
    (DRAINING, signal.SIGKILL, "rollout"),
    (DRAINING, signal.SIGTERM, "status"),  # SIGTERM (as Ctrl-C) after the swap: the promotion stands
    (ROLLING_BACK, signal.SIGKILL, "status"),
]


def _stopped(proc: subprocess.Popen, sig: signal.Signals, err: Path, phase: str, version: int, live: int) -> str:
    """What the stopped command left to remove, as the convergence says it (None: nothing): SIGKILL leaves its
    rollout to the lease's expiry; Ctrl-C and SIGTERM end it in the command (130): rolled back before the swap,
    promoted after it (the old version left to the next rollout or `--status`)."""
    code = proc.wait(HANG_S)
    stderr = err.read_text()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        _lease_expired()
        verdict = PROMOTED if phase == DRAINING else ROLLED_BACK
        left = live if phase == DRAINING else version
        return f"removing v{left}, left by the rollout of v{version}, abandoned while {phase} ({verdict})"
    assert code == 130, stderr
    assert _registry_state()["rollout"] is None, "an interrupted rollout gives its lease back"
    if phase == DRAINING:
        assert f"interrupted: promoted {MODEL} v{version} (export " in stderr, stderr
        assert f"note: interrupted while v{live} drained: v{live} is removed by the next rollout" in stderr, stderr
        return f"removing v{live}, left by a rollout that did not finish"
    said = f"interrupted: rolled back {MODEL} v{version} (export "
    assert said in stderr and f": interrupted while {phase}; v{live} kept serving" in stderr, stderr
    return None


@pytest.mark.parametrize("phase, sig, then", CASES, ids=[f"{p}-{s.name}-then-{t}" for p, s, t in CASES])
def test_a_rollout_killed_at_each_phase_fails_no_request_and_the_next_one_converges(
    server, images, labels, tmp_path, phase, sig, then
):
    before = _registry_state()
    live = int(before["live"])
    assert before["rollout"] is None or before["rollout"]["lease_s"] <= 0, before
    other = 1 - SEEDS[live]
    export = server["exports"]["edited" if phase == ROLLING_BACK else other]
    live_pids = _replicas(live)
    promoted = phase == DRAINING  # the promotion stands: the candidate is live
    load = CountedLoad(server["url"], MODEL, images, grpc=server["grpc"], clients=1)
    try:
        load.wait_for(10)
        proc, held, err = _held_rollout(server, export, phase, tmp_path / "held.json")
        version = int(held["version"])
        SEEDS[version] = other
        now_live = version if promoted else live
        assert held["live"] == live and held["pid"] == proc.pid, held
        load.wait_for(10)  # answered while the rollout is held at its phase
        proc.send_signal(sig)
        removing = _stopped(proc, sig, err, phase, version, live)
        stopped_at = time.time()
        load.wait_for(10)  # answered after it stopped
        if then == "status":
            status = rollout_status(server["gcs"])
            lines = format_status(status, MODEL)
            assert lines[: 2 if removing else 1] == [f"{MODEL}: {removing}"] * bool(removing) + [
                f"{MODEL}: live v{now_live} (v{now_live} live)"
            ], lines
            final = now_live
        else:
            stopped_at = time.time()
            result, lines = _next_rollout(server, server["exports"][1 - SEEDS[now_live]])
            assert result.verdict == PROMOTED, (result.line(), lines)
            SEEDS[result.version] = 1 - SEEDS[now_live]
            assert [line for line in lines if line.startswith("removing ")] == [removing] * bool(removing), lines
            final = result.version
            status = rollout_status(server["gcs"])
            lines = format_status(status, MODEL)
            assert lines[0] == f"{MODEL}: live v{final} (v{final} live)", lines
        load.wait_for(10)
    finally:
        answers = load.stop()
    assert not any("in progress" in line for line in lines), lines
    history = [h for h in status["history"] if h["version"] == version]
    assert [h["verdict"] for h in history] == [PROMOTED if promoted else ROLLED_BACK], history
    if sig == signal.SIGKILL:
        assert "its process was not heard of" in history[0]["reason"], history
    assert _applications() == {version_app(MODEL, final)}
    if final == live:  # the live version never stopped (never restarted)
        assert _replicas(live) == live_pids
    _check(answers, labels, {live, now_live, final}, None if promoted else (live, stopped_at))


def _check(answers, labels, allowed: set[int], only_live: tuple | None) -> None:
    """Not one request failed; each answer is its version's, from ``allowed``; ``only_live`` (version, until):
    every answer to a request sent before then is that version's (a candidate never answered a client)."""
    bad = failures(answers)
    assert not bad, f"{len(bad)} of {len(answers)} requests failed: {bad[:3]}"
    versions = {int(a.version) for a in answers if a.version}
    assert versions <= allowed, (versions, allowed)
    wrong = [a for a in answers if a.version and a.label != labels[SEEDS[int(a.version)]][a.image]]
    assert not wrong, wrong[:3]
    unversioned = [a for a in answers if not a.version]  # /predict: the label says which model answered
    assert all(a.label in {labels[SEEDS[v]][a.image] for v in allowed} for a in unversioned)
    if only_live:
        live, until = only_live
        early = [a for a in answers if a.sent < until]
        assert all(a.label == labels[SEEDS[live]][a.image] for a in early), "a client got the candidate's answer"
