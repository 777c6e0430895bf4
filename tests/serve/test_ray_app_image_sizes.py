"""`vitdeploy serve` of an export for several sizes (tiny DINOv2 with registers at 28, 42 and 56 px, base 56): a
request asks a size (`POST /predict?image_size=N`, KServe v2 ``parameters: {"image_size": N}`` over HTTP JSON,
binary and gRPC) and gets what `Predictor.at_size(N)` gives, patch tokens of that size's grid included; requests of
two sizes batched together each get their own size's answer; a size not listed is refused (400 / INVALID_ARGUMENT)
naming the sizes that work; the metadata and the configuration list the sizes; `vitdeploy validate --url
--image-size` of it passes over every protocol, judged against eager at that size."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient not installed")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient not installed")

from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess, free_port  # noqa: E402

from vitdeploy.base.vocab import EXPORT_IMAGE_SIZES  # noqa: E402
from vitdeploy.serve import protocol  # noqa: E402

pytestmark = pytest.mark.integration

ATOL = 1e-5
DIM = 64


@pytest.fixture(scope="module")
def image() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (90, 120, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def expected(sized_artifacts, image) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The vector and patch tokens of ``image`` at each size, from the in-process Predictor."""
    from vitdeploy.runtime.predictor import Predictor

    with Predictor.from_artifacts(sized_artifacts, backend="ort") as base:
        out = {}
        for size in (28, 42, 56):
            vectors, tokens = base.at_size(size).embed([image], patch_tokens=True)
            assert tokens.shape == (1, (size // 14) ** 2, DIM)
            out[size] = (vectors[0], tokens[0])
        return out


@pytest.fixture(scope="module")
def server(sized_artifacts, tmp_path_factory):
    grpc_port = free_port()
    cfg = tmp_path_factory.mktemp("serve_sized_cfg") / "pipeline.yaml"
    # a batch waits 0.3 s for more images: concurrent requests of different sizes share one batch
    cfg.write_text(
        "runtime: {threads: 1}\n"
        "serve: {max_batch_size: 8, batch_wait_timeout_s: 0.3, decode_threads: 2, metrics_port: %d,\n"
        "        max_images_per_request: 8, num_cpus_per_replica: 1, grpc_port: %d}\n" % (free_port(), grpc_port)
    )
    srv = ServeProcess(sized_artifacts, cfg, *GRPC_WITHOUT_TOKEN, start_timeout_s=240)
    srv.model = protocol.model_name(json.loads((sized_artifacts / "manifest.json").read_text())["name"])
    srv.grpc = f"127.0.0.1:{grpc_port}"
    yield srv
    assert srv.stop() == 0


def _close(got, want, what: str) -> None:
    got = np.asarray(got, dtype=np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=what)


def _doc(image: bytes, size: int | None, outputs=("EMBEDDINGS", "PATCH_TOKENS")) -> dict:
    doc = {
        "inputs": [{"name": "IMAGES", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(image).decode()]}],
        "outputs": [{"name": n} for n in outputs],
    }
    return {**doc, "parameters": {"image_size": size}} if size is not None else doc


def test_predict_answers_at_the_size_asked_and_the_base_without(server, image, expected):
    for size, query in ((42, "?image_size=42"), (56, "")):
        r = httpx.post(f"{server.url}/predict{query}", content=image, headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        _close(r.json()[0]["embedding"], expected[size][0], f"/predict{query}")


def test_v2_http_json_and_binary_answer_at_the_size_asked(server, image, expected):
    r = httpx.post(f"{server.url}/v2/models/{server.model}/infer", json=_doc(image, 28), timeout=60)
    assert r.status_code == 200, r.text
    vectors, tokens = r.json()["outputs"]
    assert tokens["shape"] == [1, 4, DIM]  # (28 / 14)^2 patch tokens
    _close(vectors["data"], expected[28][0], "v2 json vector")
    _close(tokens["data"], expected[28][1], "v2 json patch tokens")

    data = np.array([[image]], dtype=object)
    inp = httpclient.InferInput("IMAGES", [1, 1], "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    res = client.infer(server.model, [inp], parameters={"image_size": 42})
    _close(res.as_numpy("EMBEDDINGS")[0], expected[42][0], "v2 binary")


def test_v2_grpc_answers_at_the_size_asked_and_refuses_another(server, image, expected):
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.grpc)
    inp = grpcclient.InferInput("IMAGES", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[image]], dtype=object))
    asked = [grpcclient.InferRequestedOutput("PATCH_TOKENS")]
    res = client.infer(server.model, [inp], outputs=asked, parameters={"image_size": 42}, client_timeout=120)
    _close(res.as_numpy("PATCH_TOKENS")[0], expected[42][1], "grpc patch tokens")
    with pytest.raises(InferenceServerException, match="sizes that work: 28, 42, 56") as err:
        client.infer(server.model, [inp], parameters={"image_size": 35}, client_timeout=120)
    assert "INVALID_ARGUMENT" in str(err.value.status())


def test_a_size_not_listed_is_refused_naming_the_sizes_that_work(server, image):
    r = httpx.post(f"{server.url}/v2/models/{server.model}/infer", json=_doc(image, 70))
    assert r.status_code == 400 and "sizes that work: 28, 42, 56" in r.json()["error"]
    r = httpx.post(f"{server.url}/predict?image_size=big", content=image, headers={"content-type": "image/png"})
    assert r.status_code == 400 and "image_size must be a whole number" in r.json()["error"]


def test_requests_of_two_sizes_in_one_batch_each_get_their_own_size(server, image, expected):
    async def ask(client, size):
        r = await client.post(f"{server.url}/v2/models/{server.model}/infer", json=_doc(image, size))
        assert r.status_code == 200, r.text
        return size, r.json()["outputs"]

    async def all_at_once():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(ask(client, s) for s in (28, 56, 42, 28, 56, 42)))

    for size, (vectors, tokens) in asyncio.run(all_at_once()):
        _close(vectors["data"], expected[size][0], f"batched at {size}")
        _close(tokens["data"], expected[size][1], f"batched patch tokens at {size}")


def test_metadata_and_config_list_the_sizes(server):
    meta = httpx.get(f"{server.url}/v2/models/{server.model}").json()
    assert meta["parameters"][EXPORT_IMAGE_SIZES] == "28,42,56"
    assert meta["outputs"][1] == {"name": "PATCH_TOKENS", "datatype": "FP32", "shape": [-1, -1, DIM]}
    config = grpcclient.InferenceServerClient(server.grpc).get_model_config(server.model, as_json=True)["config"]
    assert config["parameters"][EXPORT_IMAGE_SIZES] == {"string_value": "28,42,56"}


@pytest.mark.parametrize("client", ["predict", "v2-http", "v2-grpc"])
def test_validate_url_asks_the_size_and_the_answers_pass_against_eager_at_it(
    server, sized_artifacts, image, tmp_path, client
):
    from vitdeploy.client.served_check import check_served

    (tmp_path / "im.png").write_bytes(image)
    url = server.grpc if client == "v2-grpc" else server.url
    model = None if client == "predict" else server.model  # /predict, as clients post it
    check = check_served(
        sized_artifacts, url, protocol=client, model=model, images=tmp_path, image_size=28, write_report=False
    )
    assert check.passed and check.row.image_size == 28, check.row.failures
    assert check.row.metrics["max_abs_diff"] < ATOL
