"""`vitdeploy rollout` for real: one `vitdeploy serve` (a tiny export, one replica) for the module, started with
Ray's defaults (token authentication on), this process joined to its Ray, a load of HTTP /predict, v2 HTTP and v2
gRPC clients running through every rollout, each of their answers counted and checked against the live model's
own. The rollouts in a subprocess are the commands docs/serving.md prints (`rollout URL ... --address
127.0.0.1:PORT`, `rollout --status`), with Ray's defaults. Last, the registry and the proxy are killed after a
promotion, under load: requests keep going to the promoted version.

Deterministic: the checks of a candidate beside the live version run while the rollout waits in its progress
callback; a held candidate is held (SIGSTOP) there; a crash at start is an export whose graph is no graph; a
candidate Ray cannot place asks for a resource no node has. Nothing waits on a clock but the bounds the rollout
itself promises (its start timeout, the shadow copy's timeout) and Ray's restart of a killed proxy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy rollout needs ray[serve] (pip install 'vitdeploy[serve]')")
pytest.importorskip("tritonclient.grpc", reason="the gRPC client needs tritonclient[grpc]")

from helpers.counted_load import CountedLoad, failures, random_pngs  # noqa: E402
from helpers.held import processes  # noqa: E402
from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess, free_port, leave_ray, serve_env  # noqa: E402
from helpers.tiny_export import PREPROCESS, file_entry  # noqa: E402

from vitdeploy.base.config import parse_config  # noqa: E402
from vitdeploy.base.ray_join import init_ray  # noqa: E402
from vitdeploy.client.protocols import PREDICT, Target, live_version  # noqa: E402
from vitdeploy.client.rollout.driver import RolloutPlan, run_rollout  # noqa: E402
from vitdeploy.runtime.backends.base import BackendOptions  # noqa: E402
from vitdeploy.serve.rollout.registry import PROMOTED, ROLLED_BACK  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "tiny"
COPY_TIMEOUT_S = 3  # serve.request_timeout_s of the rollouts: how long a shadow copy may wait for its answer
SERVE = {
    "max_batch_size": 4,
    "batch_wait_timeout_s": 0.002,
    "decode_threads": 1,
    "num_cpus_per_replica": 1,
    "graceful_shutdown_timeout_s": 5,
}


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return random_pngs(6)


def _labels(export: Path, images: list[bytes]) -> list[str]:
    """The model's own top-1 label of each image (the in-process Predictor, ort)."""
    from vitdeploy.runtime.predictor import Predictor

    with Predictor.from_artifacts(export, backend="ort") as predictor:
        return [p.label for p in predictor.predict(images, top_k=1)]


@pytest.fixture(scope="module")
def expected(tiny_artifacts, images) -> list[str]:
    return _labels(tiny_artifacts(seed=0), images)


@pytest.fixture(scope="module")
def retrained(tiny_artifacts, images) -> list[str]:
    """The labels of the retrained model (another seed, the same architecture and classes)."""
    labels = _labels(tiny_artifacts(seed=1), images)
    assert labels != _labels(tiny_artifacts(seed=0), images), "the retrained model must answer otherwise"
    return labels


@pytest.fixture(scope="module")
def server(tiny_artifacts, images, tmp_path_factory):
    """`vitdeploy serve` of the tiny export (seed 0), and this process joined to its Ray."""
    import ray

    folder = tmp_path_factory.mktemp("rollout")
    (folder / "images").mkdir()  # the exports' validation images: the faithfulness check sends them
    for seed, blob in enumerate(images):
        (folder / "images" / f"{seed}.png").write_bytes(blob)
    grpc_port = free_port()
    cfg = folder / "serve.yaml"
    cfg.write_text(
        "runtime: {threads: 1}\nserve: %s\n"
        % json.dumps({**SERVE, "metrics_port": free_port(), "grpc_port": grpc_port})
    )
    (folder / "rollout.yaml").write_text(
        "runtime: {threads: 1}\nserve: %s\nvalidation: {images: %s}\n"
        % (json.dumps({**SERVE, "request_timeout_s": COPY_TIMEOUT_S}), folder / "images")
    )
    ray_tmp = Path(tempfile.mkdtemp(prefix="vdroll", dir="/tmp"))  # short: Ray's socket paths have a length limit
    proc = ServeProcess(tiny_artifacts(seed=0), cfg, *GRPC_WITHOUT_TOKEN, env={"RAY_TMPDIR": str(ray_tmp)})
    try:
        gcs = next(line.split()[2].rstrip(":") for line in proc.lines if line.startswith("Ray at "))
        init_ray(ray, gcs, logging_level="WARNING")  # the server's Ray is on loopback: joined there
        yield {"url": proc.url, "grpc": f"127.0.0.1:{grpc_port}", "gcs": gcs, "folder": folder, "proc": proc}
    finally:
        leave_ray()
        assert proc.stop() == 0, "\n".join(proc.lines[-20:])
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _copy(source: Path, dest: Path, **changes) -> Path:
    """A copy of an export with another manifest (so another export sha); ``changes`` replace manifest keys."""
    shutil.copytree(source, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest.update(created="2025-02-02T00:00:00+00:00", **changes)
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dest


VERDICTS: list[str] = []  # of the rollouts this module ran, in order (what --status must show)
AGREED: dict[int, bool] = {}  # promoted versions: whether they agree with the version they replaced


def _rollout(server, export: Path, on_line=None, serve: dict | None = None, **plan) -> tuple:
    sv = {**SERVE, "request_timeout_s": COPY_TIMEOUT_S, **(serve or {})}
    cfg = parse_config(
        {"runtime": {"threads": 1}, "serve": sv, "validation": {"images": str(server["folder"] / "images")}}
    )
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if on_line is not None:
            on_line(line)

    args = {"backend": "ort", "shadow_requests": 20, "timeout_s": 120.0, "start_timeout_s": 120.0, **plan}
    result = run_rollout(cfg, RolloutPlan(server["url"], export, **args), BackendOptions(threads=1), progress)
    VERDICTS.append(result.verdict)
    return result, lines


def _under_load(server, images, run):
    """``run()`` while the clients send requests (answers flowing before, and after it returned); every answer."""
    load = CountedLoad(server["url"], MODEL, images, grpc=server["grpc"])
    try:
        load.wait_for(30)
        outcome = run()
        load.wait_for(30)
    finally:
        answers = load.stop()
    return outcome, answers


def _live_pids(app: str) -> list[int]:
    return sorted(processes(f"ServeReplica:{app}:"))


def _check(answers, expected, versions) -> None:
    """No failed request; every answer is the live model's, from one of ``versions``."""
    bad = failures(answers)
    assert not bad, f"{len(bad)} of {len(answers)} requests failed: {bad[:3]}"
    wrong = [a for a in answers if a.label != expected[a.image]]
    assert not wrong, f"{len(wrong)} answers are not the live model's: {wrong[:3]}"
    assert {a.version for a in answers if a.version} <= set(versions), {a.version for a in answers}


# ------------------------------------------------------------------------------------------ promote


def test_a_reexport_is_shadowed_then_promoted_without_a_failed_request(server, tiny_artifacts, images, expected):
    seen: dict = {}

    def beside(line: str) -> None:  # the candidate runs beside the live version: what clients see now
        if line.startswith("shadowing"):
            url = server["url"]
            seen["meta"] = httpx.get(f"{url}/v2/models/{MODEL}").json()
            doc = {"inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [1], "data": [_b64(images[0])]}]}
            seen["direct"] = httpx.post(f"{url}/v2/models/{MODEL}/versions/2/infer", json=doc).json()
            seen["live"] = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=doc).json()
            seen["pinned"] = live_version(Target(url, PREDICT, MODEL), MODEL)  # what `validate --url` judges
            seen["v1_predict"] = httpx.post(f"{url}/v2/models/{MODEL}/versions/1/predict", content=images[0])

    export = _copy(tiny_artifacts(seed=0), server["folder"] / "reexport")
    (result, lines), answers = _under_load(server, images, lambda: _rollout(server, export, beside))
    assert result.verdict == PROMOTED, (result.line(), lines)
    assert result.line().startswith(f"promoted {MODEL} v2 (export ") and "20 shadowed requests" in result.line()
    assert "faithful to its export (6 images, top-1 100%)" in result.line(), result.line()
    AGREED[result.version] = True
    assert any(line.startswith("checking v2 against its export's eager answers (6 images)") for line in lines)
    assert seen["meta"]["versions"] == ["1", "2"]
    assert seen["direct"]["model_version"] == "2" and seen["live"]["model_version"] == "1"
    assert seen["pinned"][0] == "1" and "judged version 1 of model tiny" in seen["pinned"][1], seen["pinned"]
    assert seen["v1_predict"].status_code == 200 and seen["v1_predict"].json()[0]["label"] == expected[0]
    _check(answers, expected, {"1", "2"})
    after = [a for a in answers if a.version and a.sent > result.window[1]]  # sent after the switch
    assert after and {a.version for a in after} == {"2"}, "unversioned requests did not move to v2"
    from ray import serve

    assert MODEL not in serve.status().applications and f"{MODEL}@v2" in serve.status().applications
    for _ in range(100):  # the guard's routing refreshes within a second: v1 is "stopping" (503), then unknown
        gone = httpx.post(f"{server['url']}/v2/models/{MODEL}/versions/1/infer", json={})
        assert gone.status_code in (404, 503), gone.text
        if gone.status_code == 404:
            break
        time.sleep(0.1)
    assert gone.status_code == 404 and "versions: 2" in gone.json()["error"]


# ------------------------------------------------------------------------------------------ roll back


def test_with_same_model_a_retrained_model_is_never_answered_to_a_client_and_is_rolled_back(
    server, tiny_artifacts, images, expected
):
    live = _live_pids(f"{MODEL}@v2")
    export = _copy(tiny_artifacts(seed=1), server["folder"] / "another")
    # it asks for more CPU than the machine has: it starts with what is free beside the live replica, and says so
    more = {"num_cpus_per_replica": 1000}
    (result, lines), answers = _under_load(
        server, images, lambda: _rollout(server, export, serve=more, shadow_requests=200, same_model=True)
    )
    assert result.verdict == ROLLED_BACK, result.line()
    said = [line for line in lines if line.startswith("starting")]
    assert "free beside the live replicas" in said[0] and "1000 asked" in said[0] and "1 thread(s)" in said[0], said
    assert result.figures["requests"] < 200, "not rolled back before its shadow budget was spent"
    assert "top1_agreement" in result.reason or "max_abs_diff" in result.reason, result.reason
    assert result.line().endswith("v2 kept serving, never stopped")
    _check(answers, expected, {"2"})
    assert _live_pids(f"{MODEL}@v2") == live, "the live version was restarted"
    from ray import serve

    assert f"{MODEL}@v{result.version}" not in serve.status().applications


def test_a_held_candidate_is_rolled_back_and_clients_never_wait_for_it(server, tiny_artifacts, images, expected):
    stopped: list[int] = []

    def hold(line: str) -> None:
        if line.startswith("shadowing"):
            live = _live_pids(f"{MODEL}@v2")
            stopped.extend(p for p in processes(f"ServeReplica:{MODEL}@v") if p not in live)
            assert stopped, "no candidate replica to hold"
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
        elif line.startswith("rolling back"):
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)

    export = _copy(tiny_artifacts(seed=0), server["folder"] / "held")
    try:
        (result, _), answers = _under_load(server, images, lambda: _rollout(server, export, hold))
    finally:  # the replica is continued whatever failed above
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert result.verdict == ROLLED_BACK
    assert f"no answer to a shadowed request within {COPY_TIMEOUT_S} s" in result.reason, result.reason
    _check(answers, expected, {"2"})


def test_a_candidate_that_crashes_at_start_is_rolled_back_by_the_command(server, tiny_artifacts, images, expected):
    import onnx

    export = _copy(tiny_artifacts(seed=0), server["folder"] / "crashes")
    graph = onnx.load(str(export / "model.onnx"))
    graph.graph.node[-1].op_type = "NoSuchOperator"  # a graph that reads well; no runtime can run it
    onnx.save(graph, str(export / "model.onnx"))
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["artifacts"]["onnx"] = file_entry(export, "model.onnx")  # consistent: only the replica finds out
    (export / "manifest.json").write_text(json.dumps(manifest))

    def run():
        args = ["--address", server["gcs"], "-b", "ort", "--shadow", "20", "--start-timeout", "120s"]
        args += ["-c", str(server["folder"] / "rollout.yaml")]
        cmd = [sys.executable, "-m", "vitdeploy.cli", "rollout", server["url"], "-a", str(export), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=serve_env(), timeout=300)

    res, answers = _under_load(server, images, run)
    VERDICTS.append(ROLLED_BACK if "rolled back" in res.stderr else PROMOTED)
    assert res.returncode == 1, res.stderr
    error = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "did not start: it failed to start" in error[0], res.stderr
    assert "v2 kept serving, never stopped" in error[0] and "Traceback" not in res.stderr
    _check(answers, expected, {"2"})


def test_a_candidate_ray_cannot_place_fails_within_its_start_timeout(server, tiny_artifacts):
    export = _copy(tiny_artifacts(seed=0), server["folder"] / "unplaceable")
    result, _ = _rollout(server, export, serve={"resources_per_replica": {"no_such_node": 1}}, start_timeout_s=3.0)
    assert result.verdict == ROLLED_BACK and result.failed_start
    assert "did not start: it did not start within 3 s" in result.reason, result.reason
    from ray import serve

    assert set(serve.status().applications) == {f"{MODEL}@v2"}


@pytest.mark.parametrize("gate", ["default", "same-model"])
def test_an_export_whose_preprocessing_was_edited_is_rolled_back_before_any_shadow(server, tiny_artifacts, gate):
    edited = {**PREPROCESS, "mean": [0.2, 0.2, 0.2]}  # its answers are no longer its own weights' answers
    export = _copy(tiny_artifacts(seed=0), server["folder"] / f"edited-{gate}", preprocess=edited)
    result, lines = _rollout(server, export, same_model=gate == "same-model")
    assert result.verdict == ROLLED_BACK and not any(line.startswith("shadowing") for line in lines), lines
    assert f"v{result.version} is not faithful to its own export: the manifest's preprocessing is not" in result.reason
    assert "mean [0.2, 0.2, 0.2] (weights [0.5, 0.5, 0.5])" in result.reason, result.reason
    assert result.figures["faithful"]["status"] == "failed"


LIVE: list[int] = [2]  # the live version, as the rollouts above left it (v1 promoted to v2 first)


def test_a_retrained_model_is_promoted_by_default_with_the_documented_command(
    server, tiny_artifacts, images, expected, retrained
):
    export = _copy(tiny_artifacts(seed=1), server["folder"] / "retrained")
    gcs = _docs_address(server)

    def run():  # docs/serving.md's command, as a user types it (-c: the tiny model's settings and images)
        args = ["-a", str(export), "-b", "ort", "--address", gcs, "--shadow", "20", "--json"]
        cmd = [sys.executable, "-m", "vitdeploy.cli", "rollout", server["url"], *args]
        cmd += ["-c", str(server["folder"] / "rollout.yaml")]
        return subprocess.run(cmd, capture_output=True, text=True, env=serve_env(), timeout=300)

    res, answers = _under_load(server, images, run)
    VERDICTS.append(PROMOTED if res.returncode == 0 else ROLLED_BACK)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout[: res.stdout.rindex("}") + 1])
    version, window = result["version"], result["window"]
    LIVE.append(version)
    AGREED[version] = False
    assert result["verdict"] == PROMOTED and result["figures"]["faithful"]["status"] == "passed"
    agreed = result["figures"]["agreement"]
    assert agreed["top1_agreement"] < 1 and agreed["flips"] > 0, agreed  # another model: promoted all the same
    assert res.stdout.rstrip().splitlines()[-1].startswith(f"promoted {MODEL} v{version} (export ")
    assert not failures(answers), failures(answers)[:3]
    by_version = {str(result["live"]): expected, str(version): retrained}
    wrong = [a for a in answers if a.version and a.label != by_version[a.version][a.image]]
    assert not wrong and {a.version for a in answers if a.version} == set(by_version), wrong[:3]
    after = [a for a in answers if a.at > window[1]]
    assert after and all(a.label == retrained[a.image] for a in after), "unversioned requests did not move"


def test_routing_survives_the_registry_and_the_proxy_killed_after_a_promotion(server, images, retrained):
    import ray

    from vitdeploy.serve.rollout.registry import registry_actor

    version = str(LIVE[-1])
    load = CountedLoad(server["url"], MODEL, images, grpc=server["grpc"])
    try:
        load.wait_for(20)
        ray.kill(registry_actor())  # for good: no restart
        load.wait_for(60)
    finally:
        answers = load.stop()
    _check_live(answers, retrained, version)
    (proxy,) = processes("ray::ProxyActor")
    os.kill(proxy, signal.SIGKILL)  # Ray Serve starts another: it has never read the routing
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if processes("ray::ProxyActor") and httpx.get(f"{server['url']}/v2/health/ready").status_code == 200:
                break
        time.sleep(0.5)
    load = CountedLoad(server["url"], MODEL, images, grpc=server["grpc"])
    try:
        load.wait_for(60)
    finally:
        answers = load.stop()
    _check_live(answers, retrained, version)


def _check_live(answers, labels, version: str) -> None:
    bad = failures(answers)
    assert not bad, f"{len(bad)} of {len(answers)} requests failed: {bad[:3]}"
    assert all(a.label == labels[a.image] for a in answers) and {a.version for a in answers if a.version} == {version}


def test_the_status_shows_every_rollout_with_its_verdict(server):
    res = subprocess.run(
        [sys.executable, "-m", "vitdeploy.cli", "rollout", "--status", "--address", _docs_address(server)],
        capture_output=True,
        text=True,
        env=serve_env(),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith(MODEL + " ")]
    verdicts = [row.split("  ")[-1].split(":")[0] for row in rows]
    assert verdicts == VERDICTS and VERDICTS, res.stdout
    live = LIVE[-1]
    assert res.stdout.startswith(f"{MODEL}: live v{live} (v{live} live)"), res.stdout  # the registry came back
    promoted = {int(row.split()[1][1:]): row for row in rows if row.split("  ")[-1].startswith(PROMOTED)}
    assert promoted.keys() == AGREED.keys(), rows
    for version, row in promoted.items():
        assert "faithful to its export (6 images, top-1 100%)" in row, row
        assert ("top-1 agreement 100.0% (0 flipped)" in row) == AGREED[version], row


def _docs_address(server) -> str:
    """The server's Ray as docs/serving.md spells it: ``127.0.0.1:<the port of the `Ray at` line>``."""
    return "127.0.0.1:" + server["gcs"].rsplit(":", 1)[1]


def _b64(blob: bytes) -> str:
    import base64

    return base64.b64encode(blob).decode()


def test_ray_finds_the_cluster_here_says_the_model_was_not_applied_from_a_config_and_gives_its_deployment(server):
    """What the rollout reads of Ray Serve's details on a real Ray: `vitdeploy serve`'s application is imperative
    (not refused as a config's), and its deployment's configuration is there (its autoscaling, when it has one)."""
    from vitdeploy.base.ray_private import local_clusters, serve_app_sources, serve_details
    from vitdeploy.client.rollout.capacity import live_autoscaling

    assert server["gcs"] in local_clusters()[1]  # what `rollout` without --address looks for finds this cluster

    sources = serve_app_sources()
    assert sources and all(origin == "imperative" for origin in sources.values()), sources
    details = serve_details()
    app = next(iter(sources))
    (deployment,) = details["applications"][app]["deployments"].values()
    assert deployment["deployment_config"] and live_autoscaling(details, app) is None


def test_grpc_inferences_are_shadowed_to_the_candidate_and_judged_by_the_gate(
    server, tiny_artifacts, images, expected, retrained
):
    """gRPC-only load (no HTTP client at all): the shadow's copies and the gate's figures come from gRPC calls
    alone (else: too few shadowed requests within the timeout, rolled back)."""
    export = _copy(tiny_artifacts(seed=1), server["folder"] / "grpc-shadow")
    load = CountedLoad(server["url"], MODEL, images, grpc=server["grpc"], clients=0)
    try:
        load.wait_for(10)
        result, lines = _rollout(server, export, timeout_s=60.0)
        load.wait_for(10)
    finally:
        answers = load.stop()
    assert {a.protocol for a in answers} == {"v2-grpc"}
    assert result.verdict == PROMOTED, (result.line(), lines)
    figures = result.figures
    assert figures["requests"] == 20 and figures["latency_ms"]["candidate"]["p50"] > 0, figures
    assert 0 <= figures["agreement"]["top1_agreement"] <= 1, figures  # measured on the gRPC copies
    assert not failures(answers), failures(answers)[:3]
    assert all(a.label in (expected[a.image], retrained[a.image]) for a in answers)
