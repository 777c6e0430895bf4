"""`vitdeploy serve` of an embedding export (a headless checkpoint, exported for real): one Ray Serve for the
module, HTTP and gRPC. Every route answers the vectors `Predictor.embed` gives on the same images with the same
backend (ort): `POST /predict` as `predict --json` records (``{"path", "embedding"}``), KServe v2 over HTTP (JSON
and the binary-tensor extension) and gRPC as EMBEDDINGS FP32 [N, D]; the export has its patch tokens too
(``model.patch_tokens``): PATCH_TOKENS FP32 [N, P, D] is answered only to a request naming it in ``outputs``, equal to
`Predictor.embed(patch_tokens=True)`'s; the metadata and configuration list both outputs; a classifier's output asked
of it is refused by name.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient not installed (pip install 'tritonclient[all]')"
)
grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient not installed (pip install 'tritonclient[all]')"
)

from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess, free_port  # noqa: E402

from vitdeploy.base.errors import ConfigError  # noqa: E402
from vitdeploy.serve import protocol  # noqa: E402

pytestmark = pytest.mark.integration

MAX_PIXELS = 4_000_000
ATOL = 1e-5  # same graph, same ONNX Runtime; only the dynamic batch around an image differs
PATCHES = (16, 64)  # the tiny DINOv2's (56 / 14)^2 patch tokens of its width


def _encoded(arr: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).convert("RGB").save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def images() -> dict[str, bytes]:
    """Two real photographs (scikit-image's) as JPEG, a random image as PNG."""
    from skimage import data

    rng = np.random.default_rng(0)
    out = {f"{n}.jpg": _encoded(getattr(data, n)(), "JPEG") for n in ("astronaut", "coffee")}
    out["noise.png"] = _encoded(rng.integers(0, 256, (90, 70, 3), dtype=np.uint8), "PNG")
    return out


@pytest.fixture(scope="module")
def embedded(embedding_artifacts, images) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each image's vector and patch tokens from the in-process Predictor, one image at a time."""
    from vitdeploy.runtime.predictor import Predictor

    with Predictor.from_artifacts(embedding_artifacts, backend="ort", max_pixels=MAX_PIXELS) as predictor:
        assert predictor.is_embedding and predictor.patch_shape == PATCHES
        out = {}
        for name, blob in images.items():
            vectors, tokens = predictor.embed([blob], patch_tokens=True)
            out[name] = (vectors[0], tokens[0])
        return out


@pytest.fixture(scope="module")
def expected(embedded) -> dict[str, np.ndarray]:
    return {name: vector for name, (vector, _) in embedded.items()}


@pytest.fixture(scope="module")
def server(embedding_artifacts, tmp_path_factory):
    grpc_port = free_port()
    cfg = tmp_path_factory.mktemp("serve_emb_cfg") / "pipeline.yaml"
    cfg.write_text(
        "runtime: {threads: 1, max_image_pixels: %d}\n"
        "serve: {max_batch_size: 8, batch_wait_timeout_s: 0.005, decode_threads: 2, metrics_port: %d,\n"
        "        max_images_per_request: 8, num_cpus_per_replica: 1, grpc_port: %d}\n"
        % (MAX_PIXELS, free_port(), grpc_port)
    )
    srv = ServeProcess(embedding_artifacts, cfg, *GRPC_WITHOUT_TOKEN, start_timeout_s=240)
    manifest = json.loads((embedding_artifacts / "manifest.json").read_text())
    srv.model = protocol.model_name(manifest["name"])
    srv.dim = manifest["io"]["output"]["shape"][1]
    srv.grpc = f"127.0.0.1:{grpc_port}"
    yield srv
    assert srv.stop() == 0


def _close(got, want, what: str) -> None:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=what)


def test_predict_answers_one_embedding_record_per_image(server, images, expected):
    r = httpx.post(f"{server.url}/predict", content=images["coffee.jpg"], headers={"content-type": "image/jpeg"})
    assert r.status_code == 200, r.text
    (record,) = r.json()
    assert set(record) == {"path", "embedding"} and record["path"] == "body"
    _close(record["embedding"], expected["coffee.jpg"], "raw body")
    names = sorted(images)
    r = httpx.post(f"{server.url}/predict", files=[("images", (n, images[n])) for n in names], timeout=60)
    assert r.status_code == 200, r.text
    assert [rec["path"] for rec in r.json()] == names
    for rec, name in zip(r.json(), names):
        assert set(rec) == {"path", "embedding"}
        _close(rec["embedding"], expected[name], f"multipart {name}")


def test_v2_http_answers_embeddings_in_json_and_in_binary(server, images, expected):
    names = sorted(images)
    doc = {
        "inputs": [
            {
                "name": "IMAGES",
                "datatype": "BYTES",
                "shape": [len(names), 1],
                "data": [base64.b64encode(images[n]).decode() for n in names],
            }
        ]
    }
    r = httpx.post(f"{server.url}/v2/models/{server.model}/infer", json=doc, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("EMBEDDINGS", "FP32", [len(names), server.dim])
    vectors = np.array(out["data"], dtype=np.float32).reshape(len(names), server.dim)
    for row, name in zip(vectors, names):
        _close(row, expected[name], f"v2 json {name}")

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    data = np.array([[images[n]] for n in names], dtype=object)
    inp = httpclient.InferInput("IMAGES", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    res = client.infer(server.model, [inp], outputs=[httpclient.InferRequestedOutput("EMBEDDINGS", binary_data=True)])
    assert res.get_response()["outputs"][0]["parameters"]["binary_data_size"] == len(names) * server.dim * 4
    for row, name in zip(res.as_numpy("EMBEDDINGS"), names):
        _close(row, expected[name], f"v2 binary {name}")
    # A classifier's output is not this model's: refused by name, as any unknown output.
    r = httpx.post(f"{server.url}/v2/models/{server.model}/infer", json={**doc, "outputs": [{"name": "LOGITS"}]})
    assert r.status_code == 400 and "unknown output 'LOGITS'; this model has EMBEDDINGS" in r.json()["error"]


def test_v2_grpc_answers_embeddings(server, images, expected):
    client = grpcclient.InferenceServerClient(server.grpc)
    names = sorted(images)
    data = np.array([[images[n]] for n in names], dtype=object)
    inp = grpcclient.InferInput("IMAGES", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    res = client.infer(server.model, [inp], client_timeout=120)
    assert [(o.name, o.datatype, list(o.shape)) for o in res.get_response().outputs] == [
        ("EMBEDDINGS", "FP32", [len(names), server.dim])
    ]
    for row, name in zip(res.as_numpy("EMBEDDINGS"), names):
        _close(row, expected[name], f"grpc {name}")


def test_patch_tokens_are_answered_only_when_named(server, images, embedded):
    """v2 HTTP JSON, binary and gRPC: PATCH_TOKENS [N, P, D] (the Predictor's) when named, alone or beside the
    vectors; the requests above, naming no output, got EMBEDDINGS alone."""
    names = sorted(images)
    tokens = {n: t for n, (_, t) in embedded.items()}
    doc = {
        "inputs": [
            {
                "name": "IMAGES",
                "datatype": "BYTES",
                "shape": [len(names)],
                "data": [base64.b64encode(images[n]).decode() for n in names],
            }
        ],
        "outputs": [{"name": "PATCH_TOKENS"}],
    }
    r = httpx.post(f"{server.url}/v2/models/{server.model}/infer", json=doc, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("PATCH_TOKENS", "FP32", [len(names), *PATCHES])
    for row, name in zip(np.array(out["data"], np.float32).reshape(len(names), *PATCHES), names):
        _close(row, tokens[name], f"v2 json patch tokens {name}")

    data = np.array([[images[n]] for n in names], dtype=object)
    inp = httpclient.InferInput("IMAGES", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    asked = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("EMBEDDINGS", "PATCH_TOKENS")]
    res = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}").infer(server.model, [inp], outputs=asked)
    for name, vector, patch in zip(names, res.as_numpy("EMBEDDINGS"), res.as_numpy("PATCH_TOKENS")):
        _close(vector, embedded[name][0], f"v2 binary {name}")
        _close(patch, tokens[name], f"v2 binary patch tokens {name}")

    ginp = grpcclient.InferInput("IMAGES", list(data.shape), "BYTES")
    ginp.set_data_from_numpy(data)
    gres = grpcclient.InferenceServerClient(server.grpc).infer(
        server.model, [ginp], outputs=[grpcclient.InferRequestedOutput("PATCH_TOKENS")], client_timeout=120
    )
    assert [o.name for o in gres.get_response().outputs] == ["PATCH_TOKENS"]
    for row, name in zip(gres.as_numpy("PATCH_TOKENS"), names):
        _close(row, tokens[name], f"grpc patch tokens {name}")


def test_metadata_and_config_show_the_embeddings_output(server):
    want = [
        {"name": "EMBEDDINGS", "datatype": "FP32", "shape": [-1, server.dim]},
        {"name": "PATCH_TOKENS", "datatype": "FP32", "shape": [-1, *PATCHES]},
    ]
    meta = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}").get_model_metadata(server.model)
    assert meta["outputs"] == want and [i["name"] for i in meta["inputs"]] == ["IMAGES"]
    gmeta = grpcclient.InferenceServerClient(server.grpc).get_model_metadata(server.model, as_json=True)
    assert [(o["name"], o["datatype"], [int(d) for d in o["shape"]]) for o in gmeta["outputs"]] == [
        ("EMBEDDINGS", "FP32", [-1, server.dim]),
        ("PATCH_TOKENS", "FP32", [-1, *PATCHES]),
    ]
    config = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}").get_model_config(server.model)
    assert [(o["name"], o["data_type"], [int(d) for d in o["dims"]]) for o in config["output"]] == [
        ("EMBEDDINGS", "TYPE_FP32", [server.dim]),
        ("PATCH_TOKENS", "TYPE_FP32", list(PATCHES)),
    ]


@pytest.mark.parametrize("proto", ["v2-http", "v2-grpc"])
def test_loadtest_of_an_embedding_server_asks_for_its_vectors(server, embedding_artifacts, proto):
    """`vitdeploy loadtest -a EXPORT`: an embedding model's requests ask for EMBEDDINGS; without -a a client asks
    for a classifier's top-k, which the server refuses by name: the warm-up says so in one error."""
    from vitdeploy.client.loadtest import LoadPlan, load_images, run_loadtest
    from vitdeploy.client.protocols import Target, asked_outputs

    url = server.grpc if proto == "v2-grpc" else server.url
    outputs = asked_outputs(embedding_artifacts)
    assert outputs == ("EMBEDDINGS",)
    target = Target(url, proto, server.model, outputs=outputs)
    plan = LoadPlan(target, load_images(None), concurrency=(2,), duration_s=None, requests=6, warmup_s=0.2)
    level = run_loadtest(plan).levels[0]
    assert level.statuses == ({"OK": 6} if proto == "v2-grpc" else {"200": 6})
    wrong = LoadPlan(
        Target(url, proto, server.model), load_images(None), concurrency=(1,), duration_s=None, requests=2
    )
    with pytest.raises(ConfigError, match="unknown output 'TOPK_LABELS'"):
        run_loadtest(wrong)


@pytest.mark.parametrize("proto", ["predict", "v2-grpc"])
def test_validate_url_judges_an_embedding_server_by_cosine_and_neighbours(server, embedding_artifacts, proto):
    """`vitdeploy validate --url` on an embedding server: its vectors against eager PyTorch's, by cosine and
    recall@k with the thresholds of the backend it says it runs (ort: fp32); no flips, no accuracy."""
    from vitdeploy.client.served_check import check_served

    url = server.grpc if proto == "v2-grpc" else server.url
    check = check_served(embedding_artifacts, url, protocol=proto, model=server.model, write_report=False)
    assert check.passed, check.row.failures
    assert check.compared == "embedding" and check.backend == "ort" and check.row.threshold_set == "fp32"
    assert check.row.metrics["recall_at_k"] == 1.0 and check.row.metrics["cosine"] > 0.99999
    assert "top1_agreement" not in check.row.metrics and not check.row.flipped and check.row.accuracy is None
