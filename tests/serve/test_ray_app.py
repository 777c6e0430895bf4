"""`vitdeploy serve` for real: one Ray Serve (started once, as a `vitdeploy serve` subprocess) and
real HTTP clients (httpx and tritonclient.http), checked against serial `vitdeploy predict`.

The tests of this file share that one server: `make test` distributes by file (`--dist loadfile`), so it
starts once per run. The last test stops the server with SIGTERM.
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")

from helpers.held import answered_while_held, held, ray_replica_pids  # noqa: E402
from helpers.otlp_receiver import OtlpReceiver, Span  # noqa: E402
from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess, free_port  # noqa: E402

from vitdeploy.demo import IMAGES_DIR as DEMO_IMAGES_DIR  # noqa: E402
from vitdeploy.serve import kserve_http, protocol, stage_timing, tracing  # noqa: E402

pytestmark = pytest.mark.integration

MAX_IMAGES = 6
APP = "vit-demo-digits"  # the application `vitdeploy serve` names after the demo export
MAX_PIXELS = 4_000_000


def _jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).convert("RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _descendants(root: int) -> dict[int, str]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            name, rest = stat.split("(", 1)[1].rsplit(")", 1)
            parents[int(entry)] = (int(rest.split()[1]), name)
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        for child, (parent, name) in parents.items():
            if parent == pid and child not in found:
                found[child] = name
                todo.append(child)
    return found


@pytest.fixture(scope="session")
def photos(tmp_path_factory) -> dict[str, bytes]:
    """Real photographs (scikit-image's bundled ones) as JPEG, and the demo model's held-out images."""
    from skimage import data

    out = {f"{name}.jpg": _jpeg(getattr(data, name)()) for name in ("astronaut", "coffee", "chelsea", "camera")}
    for path in sorted(DEMO_IMAGES_DIR.iterdir()):
        if path.suffix in (".png", ".jpg"):
            out[path.name] = path.read_bytes()
    return out


@pytest.fixture(scope="session")
def reference(demo_artifacts, photos, tmp_path_factory) -> dict[str, dict]:
    """Serial `vitdeploy predict --json` over the same files: name -> record (path = the file name)."""
    folder = tmp_path_factory.mktemp("photos")
    for name, blob in photos.items():
        (folder / name).write_bytes(blob)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "vitdeploy.cli",
            "predict",
            str(folder),
            "-a",
            str(demo_artifacts),
            "-b",
            "ort",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in res.stdout.splitlines()]
    return {Path(r["path"]).name: r for r in records}


@pytest.fixture(scope="session")
def otlp() -> OtlpReceiver:
    """The OTLP receiver the server's traces go to (OTEL_EXPORTER_OTLP_ENDPOINT)."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def server(demo_artifacts, tmp_path_factory, otlp) -> ServeProcess:
    """The server, traces on (sampling_ratio 0: only a client's sampled traceparent is traced; spans exported
    every 50 ms), KServe v2 gRPC on ``server.grpc``."""
    metrics_port, grpc_port = free_port(), free_port()
    cfg = tmp_path_factory.mktemp("serve_cfg") / "pipeline.yaml"
    cfg.write_text(
        "runtime: {threads: 1, max_image_pixels: %d}\n"
        "serve: {max_batch_size: 8, batch_wait_timeout_s: 0.005, decode_threads: 2, max_images_per_request: %d,\n"
        "        max_request_mb: 2, max_ongoing_requests: 16, max_queued_requests: 16, metrics_port: %d,\n"
        "        num_cpus_per_replica: 1, graceful_shutdown_timeout_s: 30, grpc_port: %d,\n"
        "        tracing: {sampling_ratio: 0}}\n" % (MAX_PIXELS, MAX_IMAGES, metrics_port, grpc_port)
    )
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    srv = ServeProcess(demo_artifacts, cfg, *GRPC_WITHOUT_TOKEN, metrics_port=metrics_port, env=env)
    srv.grpc = f"127.0.0.1:{grpc_port}"
    yield srv
    srv.stop()  # the shutdown test did not run (a -k selection): stop it the same way


def _expected(reference: dict, name: str, path: str) -> dict:
    return {**reference[name], "path": path}


def _post_image(url: str, blob: bytes, ctype: str = "image/jpeg", client=None) -> "httpx.Response":
    return (client or httpx).post(f"{url}/predict", content=blob, headers={"content-type": ctype}, timeout=120)


# ------------------------------------------------------------------------------------------ answers


def test_startup_prints_the_url_a_curl_example_and_progress(server):
    text = "\n".join(server.lines)
    assert "starting Ray" in text and "deploying vit-demo-digits" in text
    assert f"ready: http://127.0.0.1:{server.port}" in text
    assert f"curl -H 'Content-Type: image/jpeg' --data-binary @cat.jpg http://127.0.0.1:{server.port}/predict" in text


def test_16_concurrent_clients_get_exactly_the_answers_of_serial_predict(server, photos, reference):
    names = sorted(photos) * 3
    results: dict[int, tuple[str, int, object]] = {}

    def client(worker: int) -> None:
        with httpx.Client(timeout=120) as http:
            for j in range(worker, len(names), 16):
                name = names[j]
                r = _post_image(server.url, photos[name], "image/png" if name.endswith(".png") else "image/jpeg", http)
                results[j] = (name, r.status_code, r.json())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))
    assert len(results) == len(names)
    for name, status, body in results.values():
        assert status == 200, body
        assert body == [_expected(reference, name, "body")], name


def test_multipart_with_several_files_answers_each_in_order(server, photos, reference):
    chosen = ["astronaut.jpg", "digit7_0610.png", "coffee.jpg"]
    files = [("images", (name, photos[name])) for name in chosen]
    r = httpx.post(f"{server.url}/predict", files=files, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == [_expected(reference, name, name) for name in chosen]


def test_tritonclient_http_works_against_serve(server, photos, reference):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("vit-demo-digits")
    meta = client.get_model_metadata("vit-demo-digits")
    assert [i["name"] for i in meta["inputs"]] == ["IMAGES"] and meta["inputs"][0]["datatype"] == "BYTES"
    assert [o["name"] for o in meta["outputs"]] == ["LOGITS", "TOPK_LABELS", "TOPK_SCORES"]
    chosen = ["chelsea.jpg", "digit2_0528.png", "digit9_1704.jpg"]
    for shape, binary in (([3], True), ([3, 1], False)):
        inp = triton.InferInput("IMAGES", shape, "BYTES")
        inp.set_data_from_numpy(np.array([photos[n] for n in chosen], dtype=object).reshape(shape), binary_data=True)
        outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in protocol.OUTPUTS]
        res = client.infer("vit-demo-digits", [inp], outputs=outputs)
        labels, scores = res.as_numpy("TOPK_LABELS"), res.as_numpy("TOPK_SCORES")
        assert res.as_numpy("LOGITS").shape == (3, 10) and labels.shape == scores.shape == (3, 5)
        for row, name in enumerate(chosen):
            want = reference[name]["top_k"]
            assert [b.decode() if isinstance(b, bytes) else b for b in labels[row]] == [t["label"] for t in want]
            np.testing.assert_allclose(scores[row], [t["score"] for t in want], rtol=1e-6)
    with pytest.raises(Exception, match="unknown model 'nope'"):
        client.get_model_metadata("nope")


def _stages(response: "httpx.Response") -> dict[str, float]:
    assert response.status_code == 200, response.text
    return stage_timing.parse_server_timing(response.headers.get("server-timing"))


def test_every_answer_says_where_its_time_went_in_the_replica(server, photos):
    """Server-Timing on /predict (raw and multipart) and v2 infer: every stage, the batch the model call
    shared, and stages that account for >= 95% of the replica's time for the request."""
    blob = photos["coffee.jpg"]
    body, headers = _v2_request([blob, photos["digit7_0610.png"]])
    with httpx.Client(timeout=60) as http:
        answers = {
            "raw": _post_image(server.url, blob, client=http),
            "multipart": http.post(f"{server.url}/predict", files=[("images", ("a.jpg", blob))]),
            "v2": http.post(f"{server.url}/v2/models/{APP}/infer", content=body, headers=headers),
        }
    for kind, response in answers.items():
        split = _stages(response)
        assert set(split) == {*stage_timing.STAGES, stage_timing.TOTAL, "batch"}, (kind, split)
        accounted = sum(split[s] for s in stage_timing.STAGES)
        assert 0.95 * split["total"] <= accounted <= split["total"] + 0.01, (kind, split)
        assert split["model"] > 0 and split["decode"] > 0 and split["batch"] >= 1, (kind, split)
        assert split["total"] <= response.elapsed.total_seconds() * 1000, (kind, split)


def _grpc_infer(address: str, blob: bytes, traceparent: str) -> str:
    """One KServe v2 gRPC infer with ``traceparent`` metadata -> its Server-Timing (trailing metadata)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=APP)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "IMAGES", "BYTES"
    tensor.shape.append(1)
    request.raw_input_contents.append(len(blob).to_bytes(4, "little") + blob)
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(request, metadata=[("traceparent", traceparent)], timeout=60)
    return dict(call.trailing_metadata())[stage_timing.GRPC_KEY]


_RAY_SPANS = ("route_to_replica", "replica_handle_request")


def _complete(spans: list[Span]) -> bool:
    """A trace holds its proxy's span, Ray's router and replica spans, the request's and its five stages'."""
    names = [s.name.split(" ")[0] for s in spans]
    return any(n.startswith("proxy_") for n in names) and all(
        n in names for n in (*_RAY_SPANS, tracing.REQUEST_SPAN, *stage_timing.STAGES)
    )


def test_a_client_traceparent_is_continued_and_each_stage_is_a_span(server, otlp, photos):
    """A client's sampled traceparent (HTTP header, gRPC metadata): one trace per request with the client's trace
    id, its root the proxy's span under the client's span, then Ray's router and replica spans, vitdeploy's request
    span and its stages, whose durations are those of the answer's Server-Timing. An unsampled traceparent, and a
    request without one at sampling_ratio 0, are not traced."""
    pytest.importorskip(
        "opentelemetry.exporter.otlp.proto.http", reason="the [otel] extra: pip install 'vitdeploy[otel]'"
    )
    assert any(line.startswith(f"traces: OTLP (http/protobuf) to {otlp.endpoint}") for line in server.lines)
    blob, url = photos["digit7_0610.png"], f"{server.url}/predict"
    body, headers = _v2_request([blob])
    sent: dict[str, tuple[str, str]] = {}  # trace id -> (client span id, Server-Timing)
    with httpx.Client(timeout=60) as http:
        unsampled = "7" * 32
        for extra in ({"traceparent": f"00-{unsampled}-{'1' * 16}-00"}, {}):
            assert http.post(url, content=blob, headers={"content-type": "image/png", **extra}).status_code == 200
        for i, (path, more) in enumerate(
            ((url, {"content-type": "image/png"}), (f"{server.url}/v2/models/{APP}/infer", headers))
        ):
            trace_id, span_id = f"{i + 1:032x}", f"{i + 0xA1:016x}"
            answer = http.post(
                path, content=blob if i == 0 else body, headers={"traceparent": f"00-{trace_id}-{span_id}-01", **more}
            )
            sent[trace_id] = (span_id, answer.headers["server-timing"])
    trace_id, span_id = "f" * 32, "b" * 16
    sent[trace_id] = (span_id, _grpc_infer(server.grpc, blob, f"00-{trace_id}-{span_id}-01"))

    def by_trace(spans: list[Span]) -> dict[str, list[Span]]:
        return {t: [s for s in spans if s.trace_id == t] for t in {s.trace_id for s in spans}}

    traces = by_trace(otlp.wait_for(lambda spans: all(_complete(by_trace(spans).get(t, [])) for t in sent), 30))
    assert set(traces) == set(sent), "one trace per traced request, none for the others"
    for trace_id, (client_span, header) in sent.items():
        spans = {s.span_id: s for s in traces[trace_id]}
        roots = [s for s in spans.values() if s.parent_id not in spans]
        assert [(r.name.split(" ")[0], r.parent_id) for r in roots] == [
            ("proxy_grpc_request" if trace_id == "f" * 32 else "proxy_http_request", client_span)
        ]
        request = next(s for s in spans.values() if s.name == tracing.REQUEST_SPAN)
        chain, parent = [], spans[request.parent_id]
        while parent.parent_id in spans:
            chain.append(parent.name.split(" ")[0])
            parent = spans[parent.parent_id]
        assert chain == ["replica_handle_request", "route_to_replica"], "the request span under Ray's replica span"
        replica = spans[request.parent_id]
        assert replica.start_ns - 1e6 <= request.start_ns <= request.end_ns <= replica.end_ns + 1e6
        stages = sorted((s for s in spans.values() if s.parent_id == request.span_id), key=lambda s: s.start_ns)
        assert [s.name for s in stages] == list(stage_timing.STAGES)
        assert not [s.name for s in spans.values() if s.name.startswith(("fastapi", "POST"))], "one trace, Ray's"
        timing = stage_timing.parse_server_timing(header)
        for span in (*stages, request):
            stage = stage_timing.TOTAL if span is request else span.name
            assert abs(span.ms - timing[stage]) <= 0.0006, (trace_id, stage, span.ms, header)
        assert stages[3].attributes["vitdeploy.batch"] == timing["batch"]
        assert request.attributes == {"vitdeploy.model": APP, "vitdeploy.version": "1", "vitdeploy.backend": "ort"}


def test_prometheus_metrics_include_the_batch_sizes(server):
    deadline, text = time.time() + 60, ""
    while time.time() < deadline:
        try:
            text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        except httpx.HTTPError:
            text = ""
        if "ray_serve_actual_batch_size_count" in text:
            break
        time.sleep(2)
    count = [line for line in text.splitlines() if line.startswith("ray_serve_actual_batch_size_count")]
    assert count, "no ray_serve_actual_batch_size in the metrics"
    assert sum(float(line.rsplit(" ", 1)[1]) for line in count) > 0


def test_prometheus_metrics_have_a_histogram_per_stage_and_the_batch_per_model_call(server):
    want = {f'stage="{s}"' for s in (*stage_timing.STAGES, stage_timing.TOTAL)}
    deadline, lines = time.time() + 60, []
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        lines = [line for line in text.splitlines() if "vitdeploy_" in line and not line.startswith("#")]
        if all(any(w in line for line in lines) for w in want) and any("batch_size_count" in x for x in lines):
            break
        time.sleep(2)
    stages = [line for line in lines if line.startswith(f"ray_{stage_timing.STAGE_METRIC}_count")]
    assert {w for w in want if any(w in line for line in stages)} == want, lines[:20]
    assert all(f'model="{APP}"' in line and 'backend="ort"' in line and "version=" in line for line in stages)
    batches = [line for line in lines if line.startswith(f"ray_{stage_timing.BATCH_METRIC}_count")]
    assert batches and sum(float(line.rsplit(" ", 1)[1]) for line in batches) > 0, lines[:20]


def test_the_replica_and_proxy_run_at_the_servers_own_priority(server):
    """Ray starts its workers at nice 15 by default: a server's requests would then wait behind any
    other busy process on the machine. `vitdeploy serve` starts them at its own priority."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    workers = {
        pid: name
        for pid, name in _descendants(server.proc.pid).items()
        if name.startswith(("ray::ServeRepl", "ray::ProxyActor"))
    }
    assert len(workers) >= 2, f"replica and proxy not found among {sorted(_descendants(server.proc.pid).values())}"
    assert {name: os.getpriority(os.PRIO_PROCESS, pid) for pid, name in workers.items()} == {
        name: mine for name in workers.values()
    }


# ------------------------------------------------------------------------------------------ bad input


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height: a decompression bomb, refused from the header alone."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + struct.pack(">I", 0)
        + b"IEND"
        + struct.pack(">I", zlib.crc32(b"IEND"))
    )


def _v2_request(blobs: list[bytes], shape: list[int] | None = None) -> tuple[bytes, dict]:
    raw = kserve_http.serialize_bytes(blobs)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "IMAGES",
                    "datatype": "BYTES",
                    "shape": shape or [len(blobs)],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    return head + raw, {kserve_http.HEADER_LENGTH: str(len(head))}


def test_bad_inputs_get_4xx_and_one_line_while_good_traffic_is_unchanged(server, photos, reference):
    url = server.url
    jpeg = photos["astronaut.jpg"]
    bomb = _png_header_only(30_000, 30_000)
    big = _jpeg(np.zeros((2100, 2000, 3), np.uint8))  # 4.2 Mpx > runtime.max_image_pixels, a valid JPEG
    stop = threading.Event()
    good: list[tuple[int, object]] = []

    def good_traffic() -> None:
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                r = _post_image(url, photos["coffee.jpg"], client=http)
                good.append((r.status_code, r.json()))

    v2 = f"{url}/v2/models/vit-demo-digits/infer"
    cases = [
        ("empty body", lambda: _post_image(url, b""), 400, "empty"),
        ("not an image", lambda: _post_image(url, b"hello, I am text"), 400, "not a recognised image"),
        ("truncated", lambda: _post_image(url, jpeg[: len(jpeg) // 3]), 400, "truncated"),
        ("bomb header", lambda: _post_image(url, bomb, "image/png"), 400, "refused before decoding"),
        ("bomb pixels", lambda: _post_image(url, big), 400, "refused before decoding"),
        ("content type", lambda: _post_image(url, jpeg, "text/plain"), 415, "content type 'text/plain'"),
        ("json to /predict", lambda: httpx.post(f"{url}/predict", json={"image": "x"}), 415, "application/json"),
        (
            "too many files",
            lambda: httpx.post(f"{url}/predict", files=[("f", (f"{i}.jpg", jpeg)) for i in range(MAX_IMAGES + 1)]),
            413,
            "too many",
        ),
        ("body too large", lambda: _post_image(url, b"\xff\xd8\xff" + bytes(3 * 1024 * 1024)), 413, "over the limit"),
        (
            "v2 too many",
            lambda: httpx.post(
                v2,
                content=_v2_request([jpeg] * (MAX_IMAGES + 1))[0],
                headers=_v2_request([jpeg] * (MAX_IMAGES + 1))[1],
            ),
            400,
            "too many images",
        ),
        (
            "v2 one bad image",
            lambda: httpx.post(
                v2, content=_v2_request([jpeg, b"junk", jpeg])[0], headers=_v2_request([jpeg, b"junk", jpeg])[1]
            ),
            400,
            "IMAGES[1]:",
        ),
        ("v2 not json", lambda: httpx.post(v2, content=jpeg), 400, "not valid JSON"),
        ("v2 unknown model", lambda: httpx.post(f"{url}/v2/models/other/infer", content=b"{}"), 404, "unknown model"),
    ]
    workers = [threading.Thread(target=good_traffic) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        with ThreadPoolExecutor(len(cases)) as pool:
            answers = list(pool.map(lambda case: case[1](), cases))
    finally:
        stop.set()
        for w in workers:
            w.join()
    for (what, _, status, fragment), r in zip(cases, answers):
        assert r.status_code == status, (what, r.status_code, r.text)
        body = r.json()
        assert set(body) == {"error"} and fragment in body["error"], (what, body)
        assert "\n" not in body["error"] and "Traceback" not in body["error"] and "/tmp" not in body["error"], what
    assert good and all(s == 200 and b == [_expected(reference, "coffee.jpg", "body")] for s, b in good)


def test_one_bad_file_in_a_multipart_request_gets_its_own_error(server, photos, reference):
    files = [
        ("f", ("a.jpg", photos["camera.jpg"])),
        ("f", ("broken.jpg", b"\xff\xd8\xff\xe0garbage")),
        ("f", ("b.png", photos["digit0_0276.png"])),
    ]
    r = httpx.post(f"{server.url}/predict", files=files, timeout=60)
    assert r.status_code == 200, r.text
    first, broken, last = r.json()
    assert first == _expected(reference, "camera.jpg", "a.jpg") and last == _expected(
        reference, "digit0_0276.png", "b.png"
    )
    assert set(broken) == {"path", "error"} and broken["error"].startswith("broken.jpg: ")


def test_beyond_the_queue_is_503_not_a_hang(server, photos, reference):
    """max_ongoing_requests 16 + max_queued_requests 16: with the replica held, requests beyond what it
    admitted are refused at once (no model call needed, so no machine is too fast for it); released,
    the ones it took are answered as serial predict answers them. Ray's router admits a few more than
    16 + 16 when many arrive at once (seen: 35), so the wait allows 48."""
    jpeg = photos["astronaut.jpg"]
    answers, early = answered_while_held(
        ray_replica_pids(APP), [lambda: _post_image(server.url, jpeg)] * 80, accepted_at_most=48
    )
    codes = [getattr(r, "status_code", r) for r in answers]
    assert set(codes) <= {200, 503} and codes.count(503) >= 32 and codes.count(200) >= 1, codes
    assert all(codes[i] == 503 for i in early), codes
    for r in answers:
        if r.status_code == 503:
            assert set(r.json()) == {"error"} and r.headers.get("retry-after"), (r.headers, r.text)
        else:
            assert r.json() == [_expected(reference, "astronaut.jpg", "body")]
    # and the server is fine afterwards
    r = _post_image(server.url, photos["chelsea.jpg"])
    assert r.status_code == 200 and r.json() == [_expected(reference, "chelsea.jpg", "body")]


def test_missing_artifacts_is_one_line_before_ray_starts(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "vitdeploy.cli", "serve", "-a", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1
    assert "nope does not exist" in res.stderr, res.stderr
    assert "starting Ray" not in res.stderr


# ------------------------------------------------------------------------------------------ shutdown (last)


def _read_by_server(port: int) -> list[int]:
    """The receive queues (bytes not yet read) of the server's established connections on ``port``."""
    queues = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues_hex = fields[1], fields[3], fields[4]
        if int(local.split(":")[1], 16) == port and state == "01":  # 01: ESTABLISHED
            queues.append(int(queues_hex.split(":")[1], 16))
    return queues


def test_sigterm_drains_in_flight_requests_and_leaves_no_process(server, photos, reference):
    """16 requests the server has read (the replica held, so none can finish early) are all answered
    after SIGTERM: the drain waits for them, however slow or fast the machine."""
    processes = _descendants(server.proc.pid)
    assert any(name == "raylet" for name in processes.values()), processes
    names = ["astronaut.jpg", "coffee.jpg", "chelsea.jpg", "camera.jpg"] * 4

    def one(name: str) -> tuple[int, object]:
        with httpx.Client(timeout=120) as http:
            r = _post_image(server.url, photos[name], client=http)
            return r.status_code, r.json()

    with ThreadPoolExecutor(len(names)) as pool:
        with held(ray_replica_pids(APP)):
            futures = [pool.submit(one, n) for n in names]
            deadline = time.monotonic() + 120  # a hang guard only
            while not ((q := _read_by_server(server.port)) and len(q) >= len(names) and not any(q)):
                assert time.monotonic() < deadline, f"the server did not read the 16 requests: {q}"
                time.sleep(0.02)
            server.proc.send_signal(signal.SIGTERM)
        answers = [f.result() for f in futures]
    rc = server.proc.wait(120)
    assert rc == 0, "\n".join(server.lines[-20:])
    for name, (status, body) in zip(names, answers):
        assert status == 200 and body == [_expected(reference, name, "body")], (name, status, body)
    assert "stopped" in server.lines

    def alive() -> dict[int, str]:
        found = {}
        for pid, name in processes.items():
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found[pid] = name
            except OSError:
                pass  # gone
        return found

    deadline = time.monotonic() + 60  # Ray's processes exit on their own after `vitdeploy serve`: wait, don't guess
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(), f"processes of the serve session still running 60 s after it exited: {alive()}"
