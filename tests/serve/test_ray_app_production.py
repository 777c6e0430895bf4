"""`vitdeploy serve` under production traffic: slow clients, big bodies, every refusal as JSON, several
models on one Ray, the Ray Serve config it writes. Real Ray, real sockets, on 127.0.0.1 only.

One local Ray for the module: model A is `vitdeploy serve` owning the cluster; model B (small queue)
joins it with ``--address``; the config from ``--write-config`` runs as a third application.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")

from helpers.held import answered_while_held, ray_replica_pids  # noqa: E402
from helpers.serve_process import ServeProcess, free_port, serve_env  # noqa: E402
from helpers.sockets import listening  # noqa: E402

from vitdeploy.base.ray_loopback import RAY_CLUSTER_ENV  # noqa: E402
from vitdeploy.demo import IMAGES_DIR  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BODY_TIMEOUT_S = 10  # the stalled uploads wait this long: room for the health checks on a slow machine
MAX_MB = 2


def _config(folder: Path, name: str, extra: str = "") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        "runtime: {threads: 1}\n"
        "serve: {max_batch_size: %s, batch_wait_timeout_s: 0.005, decode_threads: 1, max_request_mb: %d,\n"
        "        body_timeout_s: %d, request_timeout_s: 60, num_cpus_per_replica: 0.5,\n"
        "        graceful_shutdown_timeout_s: 10, metrics_port: %d%s}\n"
        % ("1, concurrent_batches: 1" if extra else "4", MAX_MB, BODY_TIMEOUT_S, free_port(), extra)
    )
    return path


@pytest.fixture(scope="module")
def cluster(demo_artifacts, tmp_path_factory):
    """Model A owns the local Ray; model B (one request at a time, no queue) joins it."""
    folder = tmp_path_factory.mktemp("prod")
    port = free_port()
    a = ServeProcess(demo_artifacts, _config(folder, "a"), "--name", "model-a", port=port)
    b = None
    try:
        gcs = next(line.split()[2].rstrip(":") for line in a.lines if line.startswith("Ray at "))
        b = ServeProcess(
            demo_artifacts,
            _config(folder, "b", ", max_ongoing_requests: 1, max_queued_requests: 1"),
            "--address",
            gcs,
            "--name",
            "model-b",
            port=port,
        )
        yield {
            "url": f"http://127.0.0.1:{port}",
            "port": port,
            "gcs": gcs,
            "a": a,
            "b": b,
            "folder": folder,
            "artifacts": demo_artifacts,
        }
    finally:
        if b is not None:
            b.stop()
        assert a.stop() == 0, "\n".join(a.lines[-20:])


@pytest.fixture(scope="module")
def image() -> bytes:
    return next(p for p in sorted(IMAGES_DIR.iterdir()) if p.suffix == ".png").read_bytes()


def _assert_error(r: "httpx.Response", status: int, fragment: str = "") -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"} and "\n" not in body["error"] and fragment in body["error"], body


# ------------------------------------------------------------------------------------------ slow clients


def test_health_answers_while_64_uploads_stall_and_they_are_closed_after_the_deadline(cluster):
    stalled = []
    for _ in range(66):
        s = socket.create_connection(("127.0.0.1", cluster["port"]), timeout=30)
        s.sendall(
            b"POST /v2/models/model-a/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100000\r\n\r\n{"'
        )
        stalled.append(s)
    opened = time.monotonic()
    try:
        time.sleep(0.5)  # every upload is open and waiting
        for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/model-a/ready", "/v2/models/model-a"):
            r = httpx.get(cluster["url"] + path, timeout=BODY_TIMEOUT_S + 30)
            # answered while every stalled upload still waits for its body: health did not queue behind
            # them (no clock here: a health check that waited would come after their 408s)
            waiting = not select.select(stalled, [], [], 0)[0]
            assert r.status_code == 200 and waiting, (path, r.status_code, waiting)
        closed = 0
        for s in stalled:  # each gets 408 {"error"} once the body deadline passes, then EOF
            s.settimeout(max(1.0, opened + BODY_TIMEOUT_S + 15 - time.monotonic()))
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408"), data[:200]
            assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"].startswith("the request body did not arrive")
            closed += 1
        assert closed == len(stalled)
    finally:
        for s in stalled:
            s.close()


def test_a_70_mib_chunked_multipart_upload_gets_413_without_being_read_in_full(cluster):
    boundary = b"vitdeploy-boundary"
    s = socket.create_connection(("127.0.0.1", cluster["port"]), timeout=30)
    s.sendall(
        b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: multipart/form-data; boundary=" + boundary + b"\r\n\r\n"
    )
    head = b"--" + boundary + b'\r\nContent-Disposition: form-data; name="f"; filename="a.jpg"\r\n\r\n'
    piece = bytes(1 << 20)
    sent, answer = 0, b""
    try:
        for i in range(70):
            data = (head if i == 0 else b"") + piece
            try:
                s.sendall(b"%x\r\n" % len(data) + data + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(data)
            if select.select([s], [], [], 0.05)[0]:
                break
        s.settimeout(10)
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert "over the limit" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert sent < 16 * (1 << 20), f"{sent} bytes were accepted before the 413"


# ------------------------------------------------------------------------------------------ JSON errors


def test_framework_and_proxy_refusals_are_json_errors(cluster, image):
    url = cluster["url"]
    _assert_error(httpx.get(f"{url}/nowhere"), 404)
    _assert_error(httpx.get(f"{url}/v2/models/nope"), 404, "unknown model 'nope'")
    _assert_error(httpx.delete(f"{url}/v2/models/model-a/infer"), 405, "Method Not Allowed")
    _assert_error(httpx.get(f"{url}/v2/models/model-a/versions/9"), 404, "no version '9'")
    _assert_error(
        httpx.post(f"{url}/predict", content=image, headers={"content-type": "image/png"}), 404, "several models"
    )
    _assert_error(
        httpx.post(
            f"{url}/v2/models/model-a/predict",
            content=image,
            headers={"content-type": "image/png", "content-encoding": "br"},
        ),
        415,
        "Content-Encoding",
    )
    _assert_error(
        httpx.post(
            f"{url}/v2/models/model-a/predict",
            content=image,  # said gzip, is not
            headers={"content-type": "image/png", "content-encoding": "gzip"},
        ),
        400,
        "gzip",
    )
    import gzip

    zipped = httpx.post(
        f"{url}/v2/models/model-a/predict",
        content=gzip.compress(image),
        headers={"content-type": "image/png", "content-encoding": "gzip"},
    )
    plain = httpx.post(f"{url}/v2/models/model-a/predict", content=image, headers={"content-type": "image/png"})
    assert zipped.status_code == plain.status_code == 200 and zipped.json()[0]["label"] == plain.json()[0]["label"]
    big = httpx.post(f"{url}/v2/models/model-a/predict", content=bytes(3 << 20), headers={"content-type": "image/png"})
    _assert_error(big, 413, "over the limit")


def test_beyond_the_queue_is_a_json_503_that_tritonclient_parses(cluster, image):
    """model-b takes 1 request and queues 1: with its replica held, the requests beyond what it admits
    are refused at once, whatever the machine's speed; released, the held ones are answered. (Ray's
    router may admit a few more than 1 + 1 when many arrive together: the wait allows 8.)"""
    import numpy as np
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    def one() -> "httpx.Response":
        return httpx.post(
            f"{cluster['url']}/v2/models/model-b/predict",
            content=image,
            headers={"content-type": "image/png"},
            timeout=120,
        )

    answers, early = answered_while_held(ray_replica_pids("model-b"), [one] * 24, accepted_at_most=8)
    codes = [getattr(r, "status_code", r) for r in answers]
    assert set(codes) <= {200, 503}, codes
    assert codes.count(503) >= 16 and codes.count(200) >= 1, codes
    assert all(codes[i] == 503 for i in early), codes  # the refusals came while the model was held
    for r in answers:
        if r.status_code == 503:
            _assert_error(r, 503)
            assert r.headers.get("retry-after"), r.headers
        else:
            assert r.json()[0]["label"] == "0", r.text

    # tritonclient reads the JSON error into its exception (a text body made it fail to parse)
    client = triton.InferenceServerClient(f"127.0.0.1:{cluster['port']}", connection_timeout=120, network_timeout=120)
    inp = triton.InferInput("IMAGES", [1], "BYTES")
    inp.set_data_from_numpy(np.array([image], dtype=object))

    def infer() -> object:
        own = triton.InferenceServerClient(f"127.0.0.1:{cluster['port']}", connection_timeout=120, network_timeout=120)
        try:
            return own.infer("model-b", [inp])
        finally:
            own.close()

    results, early = answered_while_held(ray_replica_pids("model-b"), [infer] * 24, accepted_at_most=8)
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) >= 16 and all(isinstance(e, InferenceServerException) for e in errors), results
    assert all(isinstance(results[i], InferenceServerException) for i in early), results
    assert all(str(e.status()) == "503" for e in errors), [(e.status(), str(e)) for e in errors]
    assert all("Request dropped" in e.message() or "queue" in e.message() for e in errors), [str(e) for e in errors]
    answered = [r for r in results if not isinstance(r, Exception)]
    assert answered and all(r.as_numpy("TOPK_LABELS")[0][0] in (b"0", "0") for r in answered), results
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_metadata("nope")
    client.close()


# ------------------------------------------------------------------------------------------ many models


def test_two_models_answer_by_their_own_name(cluster, image):
    for name in ("model-a", "model-b"):
        r = httpx.post(
            f"{cluster['url']}/v2/models/{name}/predict",
            content=image,
            headers={"content-type": "image/png"},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()[0]["label"] == "0", (name, r.text)
        assert httpx.get(f"{cluster['url']}/v2/models/{name}").json()["name"] == name
    assert set(httpx.get(f"{cluster['url']}/v2").json()["models"]) >= {"model-a", "model-b"}


def test_the_written_config_runs_on_ray_as_a_third_model(cluster, image):
    folder = cluster["folder"]
    out = folder / "serve.yaml"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "vitdeploy.cli",
            "serve",
            "-a",
            str(cluster["artifacts"]),
            "-b",
            "ort",
            "--port",
            str(cluster["port"]),
            "--name",
            "from-config",
            "-c",
            str(_config(folder, "c")),
            "--write-config",
            str(out),
            "--write-rayservice",
            str(folder / "rayservice.yaml"),
            "--allow-unauthenticated",  # a RayService listens on 0.0.0.0 (the token: test_ray_app_auth.py)
            "--allow-insecure",  # and serves plain HTTP (HTTPS: test_tls.py)
        ],
        capture_output=True,
        text=True,
        env=serve_env(),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    import yaml

    doc = yaml.safe_load(out.read_text())
    app = doc["applications"][0]
    assert (
        app["import_path"] == "vitdeploy.serve.deploy_config:build" and app["route_prefix"] == "/v2/models/from-config"
    )
    assert app["args"]["artifacts"].startswith("file://")
    kube = yaml.safe_load((folder / "rayservice.yaml").read_text())
    assert kube["kind"] == "RayService"
    assert yaml.safe_load(kube["spec"]["serveConfigV2"])["applications"][0]["import_path"] == app["import_path"]
    env = {
        e["name"]: e["value"]
        for e in kube["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == "vitdeploy.serve.proxy_guard.middlewares"
    # Ray itself builds the application from the file (the controller imports the builder); `serve deploy`
    # posts the same file to a dashboard this test cluster does not run, `serve run` hands it over directly.
    # Ray's own CLI joins a cluster given by address with its token only when told (RAY_AUTH_MODE=token), and a
    # cluster on loopback there only with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (as the `Ray at` line says).
    run = subprocess.run(
        [str(Path(sys.executable).with_name("serve")), "run", str(out), "--address", cluster["gcs"], "--non-blocking"],
        capture_output=True,
        text=True,
        env={**serve_env(), "RAY_AUTH_MODE": "token", RAY_CLUSTER_ENV: "0"},
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    deadline = time.monotonic() + 120
    r = None
    while time.monotonic() < deadline:
        r = httpx.post(
            f"{cluster['url']}/v2/models/from-config/predict",
            content=image,
            headers={"content-type": "image/png"},
            timeout=60,
        )
        if r.status_code == 200:
            break
        time.sleep(1)
    assert r is not None and r.status_code == 200 and r.json()[0]["label"] == "0", r.text if r else None


def test_a_server_that_joined_the_cluster_opens_no_port_beyond_loopback(cluster):
    """The joined mode (--address): the joining process's own sockets are all on loopback; the owner's tree holds
    the local Ray on loopback and the replicas' inter-deployment gRPC servers, on every interface (Ray Serve binds
    [::]:0, guarded by Ray's token authentication, on by Ray's defaults), as its startup lines say."""
    joined = listening(cluster["b"].proc.pid)
    assert all(s.loopback for s in joined), joined
    owner = listening(cluster["a"].proc.pid)
    exposed = [s for s in owner if not s.loopback]
    assert exposed and all(s.command.startswith("ray::ServeReplica") and s.host == "::" for s in exposed), exposed
    assert cluster["gcs"].startswith("127.0.0.1:")
    assert any(
        line.startswith("replicas: [::]:<a port each>, every interface: Ray's token") for line in cluster["a"].lines
    )


def test_stopping_one_model_leaves_the_other(cluster, image):
    assert cluster["b"].stop() == 0
    gone = httpx.post(
        f"{cluster['url']}/v2/models/model-b/predict", content=image, headers={"content-type": "image/png"}
    )
    _assert_error(gone, 503, "not available")  # retryable: a model that was served here and is gone
    r = httpx.post(f"{cluster['url']}/predict", content=image, headers={"content-type": "image/png"}, timeout=60)
    assert r.status_code in (200, 404), r.text  # model-a and from-config remain: /predict needs a name
    r = httpx.post(
        f"{cluster['url']}/v2/models/model-a/predict", content=image, headers={"content-type": "image/png"}, timeout=60
    )
    assert r.status_code == 200 and r.json()[0]["label"] == "0", r.text
