"""`vitdeploy serve` with a serve token over HTTPS, for real: one Ray Serve (a `vitdeploy serve` subprocess,
HTTPS with a certificate the test makes, and gRPC, which Ray binds on every interface without TLS: --allow-insecure)
and real clients (httpx, curl, tritonclient.http and tritonclient.grpc), each verifying the certificate.

Without the token every model route answers 401 ``{"error"}`` with ``WWW-Authenticate: Bearer`` (gRPC:
UNAUTHENTICATED), with another token 401 too, with the token 200; the health routes answer anyone; every port the
server's processes opened is on loopback but the gRPC proxy's, which needs the token from another interface too;
the token, the TLS key and the trace collector's credentials (planted in an OTLP endpoint's user:password and in
OTEL_EXPORTER_OTLP_HEADERS) appear in no line the server printed, no Ray log, no span and no Server-Timing; a plain
HTTP request to the HTTPS port gets no answer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient not installed (pip install 'tritonclient[grpc]')"
)
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient not installed")

from helpers.certs import make_certs  # noqa: E402
from helpers.otlp_receiver import OtlpReceiver  # noqa: E402
from helpers.serve_process import ServeProcess, free_port  # noqa: E402
from helpers.sockets import listening, network_address  # noqa: E402

from vitdeploy.demo import IMAGES_DIR  # noqa: E402
from vitdeploy.serve import stage_timing  # noqa: E402
from vitdeploy.serve.auth import TOKEN_ENV  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "tests-serve-token-7f3a9c2e51b84d06"
APP = "vit-demo-digits"
#: the trace collector's credentials, planted where a careless server would copy them
OTLP_PASSWORD = "planted-otlp-password-5b1e"
OTLP_HEADER = "planted-otlp-header-9c4d"
#: Ray's own cluster token: this server runs with Ray's token authentication on, as a Ray of our own does by default
RAY_TOKEN = "ab12" * 16
SECRETS = (TOKEN, OTLP_PASSWORD, OTLP_HEADER, RAY_TOKEN)


@pytest.fixture(scope="module")
def otlp() -> OtlpReceiver:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def server(demo_artifacts, tmp_path_factory, otlp):
    import shutil
    import ssl
    import tempfile

    folder = tmp_path_factory.mktemp("auth")
    ray_tmp = Path(tempfile.mkdtemp(prefix="vdauth", dir="/tmp"))  # short: Ray's socket paths have a length limit
    grpc_port = free_port()
    certs = make_certs(folder)
    cfg = folder / "pipeline.yaml"
    cfg.write_text(
        "runtime: {threads: 1}\n"
        "serve: {max_batch_size: 4, batch_wait_timeout_s: 0.005, decode_threads: 1, num_cpus_per_replica: 1,\n"
        "        max_ongoing_requests: 8, metrics_port: %d, grpc_port: %d, tracing: {sampling_ratio: 0},\n"
        "        tls: {certfile: cert.pem, keyfile: key.pem}}\n" % (free_port(), grpc_port)
    )
    env = {
        TOKEN_ENV: TOKEN,
        "RAY_TMPDIR": str(ray_tmp),
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint.replace("://", f"://collector:{OTLP_PASSWORD}@"),
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-collector-key={OTLP_HEADER}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": RAY_TOKEN,
    }
    proc = ServeProcess(demo_artifacts, cfg, "--allow-insecure", env=env)  # gRPC: no TLS in Ray Serve
    try:
        yield {
            "proc": proc,
            "url": f"https://127.0.0.1:{proc.port}",
            "grpc": f"127.0.0.1:{grpc_port}",
            "grpc_port": grpc_port,
            "ray_tmp": ray_tmp,
            "certs": certs,
            "verify": ssl.create_default_context(cafile=str(certs.ca)),
        }
    finally:
        proc.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def image() -> bytes:
    return next(p for p in sorted(IMAGES_DIR.iterdir()) if p.suffix == ".png").read_bytes()


def _infer_body(image: bytes) -> tuple[bytes, dict[str, str]]:
    import json
    import struct

    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "IMAGES",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(image) + 4},
                }
            ]
        }
    ).encode()
    return head + struct.pack("<I", len(image)) + image, {"Inference-Header-Content-Length": str(len(head))}


def _model_routes(image: bytes) -> list[tuple[str, str, bytes, dict[str, str]]]:
    body, headers = _infer_body(image)
    prefix = f"/v2/models/{APP}"
    return [
        ("POST", "/predict", image, {"content-type": "image/png"}),
        ("POST", f"{prefix}/predict", image, {"content-type": "image/png"}),
        ("POST", f"{prefix}/infer", body, headers),
        ("GET", prefix, b"", {}),
        ("GET", f"{prefix}/config", b"", {}),
        ("GET", f"{prefix}/stats", b"", {}),
        ("GET", "/v2", b"", {}),
    ]


def test_every_model_route_needs_the_token(server, image):
    with httpx.Client(base_url=server["url"], timeout=60, verify=server["verify"]) as client:
        for method, path, body, headers in _model_routes(image):
            for auth in (None, "Bearer not-the-token-at-all-1234", f"Basic {TOKEN}"):
                sent = {**headers, **({"authorization": auth} if auth else {})}
                r = client.request(method, path, content=body or None, headers=sent)
                assert r.status_code == 401, (method, path, auth, r.status_code, r.text)
                assert r.headers["content-type"].startswith("application/json") and set(r.json()) == {"error"}
                assert r.headers["www-authenticate"].lower().startswith("bearer"), r.headers
                assert TOKEN not in r.text
            r = client.request(
                method, path, content=body or None, headers={**headers, "authorization": f"Bearer {TOKEN}"}
            )
            assert r.status_code == 200, (method, path, r.status_code, r.text)


def test_the_health_routes_answer_anyone(server):
    with httpx.Client(base_url=server["url"], timeout=60, verify=server["verify"]) as client:
        for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{APP}/ready"):
            assert client.get(path).status_code == 200, path


def test_tritonclient_passes_the_token_with_headers(server, image):
    import numpy as np

    headers = {"authorization": f"Bearer {TOKEN}"}  # gRPC metadata keys are lower case
    images = np.array([image], dtype=np.object_)
    https = {"ssl": True, "ssl_options": {"ca_certs": str(server["certs"].ca)}}
    for module, url in ((httpclient, server["url"].removeprefix("https://")), (grpcclient, server["grpc"])):
        client = module.InferenceServerClient(url, **(https if module is httpclient else {}))
        tensor = module.InferInput("IMAGES", [1], "BYTES")
        tensor.set_data_from_numpy(images)
        assert client.is_server_live() and client.is_model_ready(APP)  # health: no token
        with pytest.raises(module.InferenceServerException) as refused:
            client.infer(APP, [tensor])
        status = str(refused.value.status())
        assert ("401" in status) if module is httpclient else ("UNAUTHENTICATED" in status), status
        with pytest.raises(module.InferenceServerException):
            client.get_model_metadata(APP)
        with pytest.raises(module.InferenceServerException):
            client.infer(APP, [tensor], headers={"authorization": "Bearer another-token-that-is-wrong"})
        result = client.infer(APP, [tensor], headers=dict(headers))  # tritonclient.http adds to the dict it gets
        assert result.as_numpy("LOGITS").shape[0] == 1
        assert client.get_model_metadata(APP, headers=dict(headers))
        client.close()


def _infer_request(image: bytes):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=APP)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "IMAGES", "BYTES"
    tensor.shape.append(1)
    request.raw_input_contents.append(len(image).to_bytes(4, "little") + image)
    return request


def test_every_port_the_server_opened_is_on_loopback_or_needs_a_token_from_another_interface(server, image):
    """The sockets of the server's whole process tree (Ray's GCS, raylet, agents, workers, the proxies): on loopback,
    but the gRPC proxy's and each replica's inter-deployment gRPC server, which Ray binds on every interface, as the
    startup lines say. From this machine's network address each of those answers only with a token (the serve
    token, Ray's), and the HTTPS port is not there."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    sockets = listening(server["proc"].proc.pid)
    assert {s.port for s in sockets} >= {server["proc"].port, server["grpc_port"]}, sockets
    exposed = [s for s in sockets if not s.loopback]
    replicas = {s.port for s in exposed if s.command.startswith("ray::ServeReplica")}
    assert replicas and {s.port for s in exposed} == {server["grpc_port"], *replicas}, sockets
    assert all(s.host == "::" for s in exposed), exposed
    text = "\n".join(server["proc"].lines)
    assert f"gRPC:  [::]:{server['grpc_port']}, every interface: a token, no TLS" in text
    assert "replicas: [::]:<a port each>, every interface: Ray's token, no TLS" in text
    assert f"HTTPS: 127.0.0.1:{server['proc'].port}, this machine only" in text
    assert "Ray's ports: 127.0.0.1:" in text and "Ray at 127.0.0.1:" in text
    address = network_address()
    if address is None:
        pytest.skip("this machine has no address beyond loopback to call from")
    with grpc.insecure_channel(f"{address}:{server['grpc_port']}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_infer_request(image), timeout=60)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        auth = [("authorization", f"Bearer {TOKEN}")]
        assert stub.ModelInfer(_infer_request(image), metadata=auth, timeout=60).outputs
    for port in replicas:  # Ray's interceptor refuses before anything is unpickled
        with grpc.insecure_channel(f"{address}:{port}") as channel:
            call = channel.unary_unary("/ray.serve.ASGIService/HandleRequest")
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=30)  # an empty ASGIRequest: refused before its (empty) pickle is read
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (port, refused.value)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"https://{address}:{server['proc'].port}/v2/health/live", verify=False, timeout=10)


def test_no_secret_in_a_line_a_log_a_span_or_a_server_timing_of_a_served_request(server, otlp, image):
    """The red team's served request: the token, the TLS key and the collector's credentials (planted in the
    endpoint's user:password and in OTEL_EXPORTER_OTLP_HEADERS) are in no line the server printed, no Ray log, no
    span exported (names and attributes) and no Server-Timing value of a traced request."""
    wrong = {"authorization": "Bearer wrong-token-0123456789"}
    httpx.post(f"{server['url']}/predict", content=image, headers=wrong, verify=server["verify"])
    trace_id = "5" * 32
    traced = {
        "authorization": f"Bearer {TOKEN}",
        "content-type": "image/png",
        "traceparent": f"00-{trace_id}-{'6' * 16}-01",
    }
    answer = httpx.post(f"{server['url']}/predict", content=image, headers=traced, verify=server["verify"])
    assert answer.status_code == 200, answer.text
    timing = answer.headers["server-timing"]
    spans = otlp.wait_for(lambda found: any(s.trace_id == trace_id for s in found), 30)
    exported = " ".join(f"{s.name} {s.service} {s.attributes}" for s in spans)
    text = "\n".join(server["proc"].lines)
    assert "needs Authorization: Bearer <token>" in text and f"ready: {server['url']}" in text
    assert "traces: OTLP (http/protobuf) to http://127.0.0.1:" in text  # the endpoint, its user:password left out
    for secret in SECRETS:
        for where, seen in (("printed", text), ("span", exported), ("Server-Timing", timing)):
            assert secret not in seen, (where, secret)
    key = "".join(server["certs"].key_text.splitlines()[1:-1]).encode()  # the key's base64, without its armour
    assert key.decode() not in text.replace("\n", "")
    logs = [p for p in server["ray_tmp"].rglob("*") if p.is_file() and p.suffix in (".log", ".out", ".err", ".json")]
    assert logs, "no Ray log found under RAY_TMPDIR"
    for path in logs:
        try:
            data = path.read_bytes()
        except OSError:  # a socket or a file Ray removed meanwhile
            continue
        assert key not in data.replace(b"\n", b""), path
        for secret in SECRETS:
            assert secret.encode() not in data, (path, secret)
    assert os.environ.get(TOKEN_ENV) != TOKEN  # the test process itself never had it


def test_https_is_verified_by_curl_and_plain_http_gets_no_answer(server, image):
    import shutil
    import subprocess

    if shutil.which("curl"):
        res = subprocess.run(
            ["curl", "-sS", "--cacert", str(server["certs"].ca), "-H", f"Authorization: Bearer {TOKEN}"]
            + ["-H", "Content-Type: image/png", "--data-binary", "@-", f"{server['url']}/predict"],
            input=image,
            capture_output=True,
            timeout=60,
        )
        assert res.returncode == 0 and b'"top_k"' in res.stdout, res.stderr
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # a client that does not trust it
        httpx.get(f"{server['url']}/v2/health/ready", timeout=10)
    plain = server["url"].replace("https://", "http://")
    try:
        answer = httpx.post(
            f"{plain}/predict", content=image, headers={"authorization": f"Bearer {TOKEN}"}, timeout=10
        )
    except httpx.HTTPError:
        return  # the connection closed: nothing useful
    assert answer.status_code >= 400 and "top_k" not in answer.text, answer.text


def test_grpc_answers_carry_server_timing_as_trailing_metadata(server, image):
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    request = _infer_request(image)
    with grpc.insecure_channel(server["grpc"]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response, call = stub.ModelInfer.with_call(
            request, metadata=[("authorization", f"Bearer {TOKEN}")], timeout=60
        )
    assert response.outputs
    trailing = dict(call.trailing_metadata())
    split = stage_timing.parse_server_timing(trailing.get(stage_timing.GRPC_KEY))
    assert set(split) == {*stage_timing.STAGES, stage_timing.TOTAL, "batch"}, trailing
    assert 0.95 * split["total"] <= sum(split[s] for s in stage_timing.STAGES) <= split["total"] + 0.01, split
