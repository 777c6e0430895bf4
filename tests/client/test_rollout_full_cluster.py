"""Capacity kept on a full cluster, for real: `vitdeploy serve` of the tiny export with 3 replicas on a Ray of its
own whose CPUs hold exactly 4 replicas (``serve.num_cpus_per_replica`` = the machine's cores / 4: `serve` starts
its Ray with the machine's cores), Ray's defaults (token authentication on), this process joined to its Ray. A
rollout of a re-export under a load of HTTP /predict, v2 HTTP and v2 gRPC clients, every answer counted: the
candidate gets the one free slot, then the old version gives up a replica for each one the candidate takes while
unversioned requests are split between them, requests move, the old version drains.

What is checked is what an operator relies on: the replicas answering unversioned requests, observed all along
(Ray Serve's RUNNING replicas of the versions the routing table sends requests to), never fall below the live
count minus one (the plan keeps the live count itself); no request fails; every answer is the model's; the promoted
version ends with the live version's 3 replicas. Deterministic: the cluster is full by construction (a fourth
slot, never a fifth), whatever the machine's cores; nothing waits on a clock but the rollout's own bounds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy rollout needs ray[serve] (pip install 'vitdeploy[serve]')")
pytest.importorskip("tritonclient.grpc", reason="the gRPC client needs tritonclient[grpc]")

from helpers.counted_load import CountedLoad, failures  # noqa: E402
from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess, free_port, leave_ray  # noqa: E402

from vitdeploy.base.config import parse_config  # noqa: E402
from vitdeploy.base.ray_join import init_ray  # noqa: E402
from vitdeploy.client.rollout.driver import RolloutPlan, run_rollout  # noqa: E402
from vitdeploy.runtime.backends.base import BackendOptions  # noqa: E402
from vitdeploy.serve.rollout.registry import PROMOTED  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "tiny"
LIVE = 3  # the live version's replicas; the cluster holds LIVE + 1
CPUS = (os.cpu_count() or 1) / (LIVE + 1)  # serve's Ray has the machine's cores: exactly LIVE + 1 replicas fit
SERVE = {
    "replicas": LIVE,
    "num_cpus_per_replica": CPUS,
    "max_batch_size": 4,
    "batch_wait_timeout_s": 0.002,
    "decode_threads": 1,
    "graceful_shutdown_timeout_s": 5,
}


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    import io

    import numpy as np
    from PIL import Image

    out = []
    for seed in range(4):
        pixels = (np.random.default_rng(seed).random((40, 40, 3)) * 255).astype("uint8")
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


@pytest.fixture(scope="module")
def full(tiny_artifacts, images, tmp_path_factory):
    """`vitdeploy serve` of the tiny export, 3 replicas on a Ray with room for one more; this process joined."""
    import ray

    folder = tmp_path_factory.mktemp("full")
    (folder / "images").mkdir()
    for seed, blob in enumerate(images):
        (folder / "images" / f"{seed}.png").write_bytes(blob)
    grpc_port = free_port()
    cfg = folder / "serve.yaml"
    cfg.write_text("runtime: {threads: 1}\nserve: %s\n" % json.dumps({**SERVE, "grpc_port": grpc_port}))
    ray_tmp = Path(tempfile.mkdtemp(prefix="vdfull", dir="/tmp"))  # short: Ray's socket paths have a length limit
    proc = ServeProcess(tiny_artifacts(seed=0), cfg, *GRPC_WITHOUT_TOKEN, env={"RAY_TMPDIR": str(ray_tmp)})
    try:
        gcs = next(line.split()[2].rstrip(":") for line in proc.lines if line.startswith("Ray at "))
        init_ray(ray, gcs, logging_level="WARNING")
        yield {"url": proc.url, "grpc": f"127.0.0.1:{grpc_port}", "folder": folder}
    finally:
        leave_ray()
        assert proc.stop() == 0, "\n".join(proc.lines[-20:])
        shutil.rmtree(ray_tmp, ignore_errors=True)


class Observed:
    """Polls, until stopped, the replicas answering unversioned requests: the RUNNING replicas of the version the
    routing table sends them to, and of the promoted one while it splits them."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int]] = []  # (old running, new running, answering)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        from ray import serve

        from vitdeploy.serve.rollout.store import read_routing

        while not self._stop.wait(0.1):
            entry = (read_routing(time.time()) or {}).get(MODEL)
            apps = serve.status().applications

            def running(app: str) -> int:
                status = apps.get(app)
                return sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values()) if status else 0

            live_app = entry["live_app"] if entry else MODEL
            split = (entry or {}).get("split")
            answering = running(live_app) + (running(split["app"]) if split and split["share"] > 0 else 0)
            self.seen.append((running(MODEL), running(f"{MODEL}@v2"), answering))

    def stop(self) -> list[tuple[int, int, int]]:
        self._stop.set()
        self._thread.join(30)
        return self.seen


def test_a_promotion_on_a_full_cluster_never_answers_with_fewer_than_the_live_replicas_minus_one(
    full, tiny_artifacts, images
):
    from ray import serve

    from vitdeploy.serve.rollout.candidate import replica_count

    assert replica_count(MODEL) == LIVE and serve.status().applications[MODEL].status.endswith("RUNNING")
    export = full["folder"] / "reexport"
    shutil.copytree(tiny_artifacts(seed=0), export)
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["created"] = "2025-02-02T00:00:00+00:00"  # another export sha, the same model
    (export / "manifest.json").write_text(json.dumps(manifest, indent=2))
    cfg = parse_config(
        {"runtime": {"threads": 1}, "serve": dict(SERVE), "validation": {"images": str(full["folder"] / "images")}}
    )
    plan = RolloutPlan(full["url"], export, backend="ort", shadow_requests=10, timeout_s=120.0, start_timeout_s=120.0)
    lines: list[str] = []
    load = CountedLoad(full["url"], MODEL, images, grpc=full["grpc"], clients=1)
    observed = Observed()
    try:
        load.wait_for(20)
        result = run_rollout(cfg, plan, BackendOptions(threads=1), lines.append)
        load.wait_for(20)
    finally:
        seen = observed.stop()
        answers = load.stop()
    assert result.verdict == PROMOTED, (result.line(), lines)
    assert any(line.startswith("splitting unversioned requests between v1 and v2") for line in lines), lines
    assert sum(line.startswith("v1 gives up a replica") for line in lines) == LIVE - 1, lines
    bad = failures(answers)
    assert not bad, f"{len(bad)} of {len(answers)} requests failed: {bad[:3]}"
    assert {a.version for a in answers if a.version} == {"1", "2"}, "requests never reached both versions"
    assert seen and min(answering for _, _, answering in seen) >= LIVE - 1, seen
    assert max(old + new for old, new, _ in seen) <= LIVE + 1, seen  # the cluster was full: never a fifth
    assert any(0 < old < LIVE and new > 1 for old, new, _ in seen), seen  # the old version did step down
    assert replica_count(f"{MODEL}@v2") == LIVE and MODEL not in serve.status().applications
    assert not [n for n in result.notes if "replica" in n], result.notes  # no capacity fell short
