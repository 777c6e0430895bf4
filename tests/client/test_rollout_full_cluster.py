"""Capacity kept on a full cluster, for real: `vitdeploy serve` of the tiny export with 3 replicas on a Ray of its
own whose CPUs hold exactly 4 replicas (``serve.num_cpus_per_replica`` = the machine's cores / 4: `serve` starts
its Ray with the machine's cores), Ray's defaults (token authentication on). The rollout, as docs/serving.md prints
it (`rollout URL -a ... --address 127.0.0.1:PORT`), of a re-export under a load of HTTP /predict, v2 HTTP and v2
gRPC clients, every answer counted, and an observer of the replicas (both processes of their own: this one never
joins Ray, so it shares no Ray client state with the suite's other modules): the candidate gets the one free slot,
then the old version gives up a replica for each one the candidate takes while unversioned requests are split
between them, requests move, the old version drains.

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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy rollout needs ray[serve] (pip install 'vitdeploy[serve]')")
pytest.importorskip("tritonclient.grpc", reason="the gRPC client needs tritonclient[grpc]")

from helpers.counted_load import CountedLoad, failures, random_pngs  # noqa: E402
from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess, free_port, serve_env  # noqa: E402

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
    return random_pngs(4)


@pytest.fixture(scope="module")
def full(tiny_artifacts, images, tmp_path_factory):
    """`vitdeploy serve` of the tiny export, 3 replicas on a Ray with room for one more (this process never joins
    it: the rollout and the observer are processes of their own)."""
    folder = tmp_path_factory.mktemp("full")
    (folder / "images").mkdir()
    for seed, blob in enumerate(images):
        (folder / "images" / f"{seed}.png").write_bytes(blob)
    grpc_port = free_port()
    (folder / "serve.yaml").write_text(
        "runtime: {threads: 1}\nserve: %s\n" % json.dumps({**SERVE, "grpc_port": grpc_port})
    )
    (folder / "rollout.yaml").write_text(
        "runtime: {threads: 1}\nserve: %s\nvalidation: {images: %s}\n" % (json.dumps(SERVE), folder / "images")
    )
    ray_tmp = Path(tempfile.mkdtemp(prefix="vdfull", dir="/tmp"))  # short: Ray's socket paths have a length limit
    env = {"RAY_TMPDIR": str(ray_tmp)}
    proc = ServeProcess(tiny_artifacts(seed=0), folder / "serve.yaml", *GRPC_WITHOUT_TOKEN, env=env)
    try:
        gcs = next(line.split()[2].rstrip(":") for line in proc.lines if line.startswith("Ray at "))
        yield {"url": proc.url, "grpc": f"127.0.0.1:{grpc_port}", "gcs": gcs, "folder": folder}
    finally:
        assert proc.stop() == 0, "\n".join(proc.lines[-20:])
        shutil.rmtree(ray_tmp, ignore_errors=True)


#: the observer: joins the server's Ray and prints, every 0.1 s, the RUNNING replicas of v1 and v2 and those that
#: answer unversioned requests (of the version the routing table sends them to, and of the promoted one while it
#: splits them), one JSON line each
OBSERVER = """
import json, sys, time
import ray
from ray import serve
from vitdeploy.base.ray_join import init_ray
from vitdeploy.serve.rollout.store import read_routing

init_ray(ray, sys.argv[1], logging_level="ERROR", log_to_driver=False)
model = sys.argv[2]
while True:
    entry = (read_routing(time.time()) or {}).get(model)
    apps = serve.status().applications

    def running(app):
        status = apps.get(app)
        return sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values()) if status else 0

    split = (entry or {}).get("split")
    answering = running(entry["live_app"] if entry else model)
    answering += running(split["app"]) if split and split["share"] > 0 else 0
    print(json.dumps([running(model), running(model + "@v2"), answering]), flush=True)
    time.sleep(0.1)
"""


class Observed:
    """The observer as a process of its own (this test process never joins Ray); ``stop()``: what it printed."""

    def __init__(self, gcs: str) -> None:
        self.seen: list[tuple[int, int, int]] = []
        cmd = [sys.executable, "-c", OBSERVER, gcs, MODEL]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=serve_env()
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.seen.append(tuple(json.loads(line)))

    def wait_for(self, what, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(what(seen) for seen in list(self.seen)):
            assert self.proc.poll() is None and time.monotonic() < deadline, f"the observer saw {self.seen[-3:]}"
            time.sleep(0.1)

    def stop(self) -> list[tuple[int, int, int]]:
        self.proc.terminate()
        self.proc.wait(60)
        self._thread.join(10)
        return list(self.seen)


def test_a_promotion_on_a_full_cluster_never_answers_with_fewer_than_the_live_replicas_minus_one(
    full, tiny_artifacts, images
):
    export = full["folder"] / "reexport"
    shutil.copytree(tiny_artifacts(seed=0), export)
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["created"] = "2025-02-02T00:00:00+00:00"  # another export sha, the same model
    (export / "manifest.json").write_text(json.dumps(manifest, indent=2))
    # docs/serving.md's command (-c: the tiny model's settings and images)
    cmd = [sys.executable, "-m", "vitdeploy.cli", "rollout", full["url"], "-a", str(export), "-b", "ort"]
    cmd += ["--address", full["gcs"], "--shadow", "10", "--json", "-c", str(full["folder"] / "rollout.yaml")]
    observed = Observed(full["gcs"])
    load = CountedLoad(full["url"], MODEL, images, grpc=full["grpc"], clients=1)
    try:
        observed.wait_for(lambda seen: seen == (LIVE, 0, LIVE))  # the live version, whole, before anything
        load.wait_for(20)
        res = subprocess.run(cmd, capture_output=True, text=True, env=serve_env(), timeout=600)
        observed.wait_for(lambda seen: seen == (0, LIVE, LIVE))  # the old version gone, the new one whole
        load.wait_for(20)
    finally:
        answers = load.stop()
        seen = observed.stop()
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout[: res.stdout.rindex("}") + 1])
    lines = res.stderr.splitlines()
    assert result["verdict"] == PROMOTED, lines
    assert any(line.startswith("splitting unversioned requests between v1 and v2") for line in lines), lines
    assert sum(line.startswith("v1 gives up a replica") for line in lines) == LIVE - 1, lines
    bad = failures(answers)
    assert not bad, f"{len(bad)} of {len(answers)} requests failed: {bad[:3]}"
    assert {a.version for a in answers if a.version} == {"1", "2"}, "requests never reached both versions"
    for image in range(len(images)):  # the same model: each image has one answer, whichever version gave it
        assert len({a.label for a in answers if a.image == image}) == 1, [a for a in answers if a.image == image][:4]
    assert min(answering for _, _, answering in seen) >= LIVE - 1, seen
    assert max(old + new for old, new, _ in seen) <= LIVE + 1, seen  # the cluster was full: never a fifth
    assert any(0 < old < LIVE and new > 1 for old, new, _ in seen), seen  # the old version did step down
    assert not [n for n in result["notes"] if "replica" in n], result["notes"]  # no capacity fell short
