"""The generated Triton repository on a REAL tritonserver (the one bundled in the nvidia-pytriton
wheel, in .venv-triton), queried over HTTP and gRPC with tritonclient: answers equal the in-process
Predictor's on real photos and the demo images, the preprocessing is the runtime's bit for bit, and
bad images fail only their own request while good traffic goes on.

That server has the python backend only, so the repository is generated with the ensemble over
``<name>_ort_python`` and only the ensemble (and the models it calls) is loaded.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from vitdeploy.demo import IMAGES_DIR as DEMO_IMAGES_DIR
from vitdeploy.serve.triton.local import BundledTriton, default_venv

httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient not installed (pip install 'tritonclient[http,grpc]')"
)
grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient not installed (pip install 'tritonclient[http,grpc]')"
)
from helpers.counted_load import CountedLoad  # noqa: E402
from helpers.held import answered_while_held, triton_stub_pids  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration

NAME = "vit-demo-digits"
SMALL_QUEUE = "small-queue"
TAMPERED = "tampered"
TINY = "tiny"  # the tiny export's repository, switched to a second export as version 2 (--new-version)
TINY_TRITON = {"triton": {"inference": "ort_python", "max_queue_delay_us": 2000}}
MAX_PIXELS = 600_000  # runtime.max_image_pixels for this repository: the "bomb" below exceeds it
VENV = default_venv()


def _require_triton_env() -> None:
    if (VENV / "bin" / "python").exists():
        return
    reason = f"no {VENV} (create it with `make triton-env`): the bundled tritonserver is not installed"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _jpeg(arr: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def images() -> dict[str, bytes]:
    """Real photos (scikit-image's sample images, saved as JPEG) and every demo image."""
    data = pytest.importorskip("skimage.data", reason="scikit-image not installed (pip install scikit-image)")
    out = {f"{n}.jpg": _jpeg(getattr(data, n)()) for n in ("astronaut", "coffee", "chelsea", "rocket", "camera")}
    for path in sorted(DEMO_IMAGES_DIR.iterdir()):
        if path.suffix in (".png", ".jpg"):
            out[path.name] = path.read_bytes()
    return out


@pytest.fixture(scope="module")
def predictor(demo_artifacts: Path):
    from vitdeploy.runtime.predictor import Predictor

    with Predictor.from_artifacts(demo_artifacts, backend="ort", max_pixels=MAX_PIXELS) as p:
        yield p


@pytest.fixture(scope="module")
def tampered(demo_artifacts: Path, tmp_path_factory) -> dict[str, Path]:
    """A renamed copy of the demo export (its own export) and its repository, whose preprocessing model's resize
    filter was edited after generation: what `validate --url` must catch and name."""
    from vitdeploy.base.config import parse_config
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    root = tmp_path_factory.mktemp("tampered")
    export = root / "export"
    shutil.copytree(demo_artifacts, export, ignore=shutil.ignore_patterns("drift-report.json", "report.html"))
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["name"] = TAMPERED
    (export / "manifest.json").write_text(json.dumps(manifest))
    cfg = parse_config({"triton": {"inference": "ort_python"}})
    repo = build_triton_repo(export, root / "repo", settings_from_config(cfg)).path
    config = repo / f"{TAMPERED}_preprocess" / "config.pbtxt"
    was = manifest["preprocess"]["interpolation"]
    edited = config.read_text().replace(
        f'\\"interpolation\\": \\"{was}\\"',
        f'\\"interpolation\\": \\"{"nearest" if was != "nearest" else "bicubic"}\\"',
    )
    assert edited != config.read_text()
    config.write_text(edited)
    return {"export": export, "repo": repo}


@pytest.fixture(scope="module")
def versioned(tiny_artifacts, tmp_path_factory) -> Path:
    """The tiny export's repository (version 1), served by ``server``; one test adds version 2 to it."""
    from vitdeploy.base.config import parse_config
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    settings = settings_from_config(parse_config(TINY_TRITON))
    return build_triton_repo(tiny_artifacts(seed=0), tmp_path_factory.mktemp("versioned") / "repo", settings).path


@pytest.fixture(scope="module")
def server(demo_artifacts: Path, tampered: dict[str, Path], versioned: Path, tmp_path_factory):
    _require_triton_env()
    from vitdeploy.base.config import parse_config
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    root = tmp_path_factory.mktemp("triton")
    cfg = parse_config(
        {
            "runtime": {"max_image_pixels": MAX_PIXELS},
            "triton": {"inference": "ort_python", "max_queue_delay_us": 5000, "decode_threads": 2},
        }
    )
    repo = build_triton_repo(demo_artifacts, root / "repo", settings_from_config(cfg)).path
    # A second copy of the model under another name, with a queue of one request, in its own repository.
    renamed = root / "renamed"
    shutil.copytree(demo_artifacts, renamed)
    manifest = json.loads((renamed / "manifest.json").read_text())
    manifest["name"] = SMALL_QUEUE
    (renamed / "manifest.json").write_text(json.dumps(manifest))
    small = parse_config({"triton": {"inference": "ort_python", "max_queue_size": 1, "max_queue_delay_us": 20000}})
    repo2 = build_triton_repo(renamed, root / "repo2", settings_from_config(small)).path
    repos, load = [repo, repo2, tampered["repo"], versioned], [NAME, SMALL_QUEUE, TAMPERED, TINY]
    with BundledTriton(VENV, repos, load=load) as triton:
        yield triton


def _http_infer(server: BundledTriton, blobs: list[bytes], model: str = NAME, outputs=None):
    client = httpclient.InferenceServerClient(server.http_url)
    data = np.array([[b] for b in blobs], dtype=object)
    inp = httpclient.InferInput("IMAGES", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    return client.infer(model, [inp], outputs=outputs)


def _grpc_infer(server: BundledTriton, blobs: list[bytes]):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.array([[b] for b in blobs], dtype=object)
    inp = grpcclient.InferInput("IMAGES", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    return client.infer(NAME, [inp])


def _answer(result) -> tuple[np.ndarray, list[list[str]], np.ndarray]:
    labels = [[v.decode("utf-8") for v in row] for row in result.as_numpy("TOPK_LABELS")]
    return result.as_numpy("LOGITS"), labels, result.as_numpy("TOPK_SCORES")


def _expected(predictor, blob: bytes) -> tuple[np.ndarray, list[str], np.ndarray]:
    logits = predictor.predict_logits(predictor.preprocess([blob]))[0]
    (pred,) = predictor.predictions_from_logits(logits[None], top_k=5)
    return logits, [label for label, _, _ in pred.top_k], np.array([s for _, _, s in pred.top_k], dtype=np.float32)


def _assert_same(got, want, what: str) -> None:
    logits, labels, scores = got
    w_logits, w_labels, w_scores = want
    # Same ONNX graph on the same ONNX Runtime; only the dynamic batch around the image differs.
    np.testing.assert_allclose(logits, w_logits, rtol=0, atol=1e-5, err_msg=what)
    assert labels == w_labels, what
    np.testing.assert_allclose(scores, w_scores, rtol=0, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("wanted", [["TOPK_LABELS", "TOPK_SCORES"], ["LOGITS"], ["TOPK_LABELS"]])
def test_a_client_may_ask_for_any_subset_of_the_outputs(server: BundledTriton, images, predictor, wanted):
    """Asking for the top-k alone is what most clients do: the ensemble answered such requests 400 "unexpected
    deadlock" while its LOGITS output was also a later step's input (now every output comes from postprocess)."""
    blob = images["coffee.jpg"]
    result = _http_infer(server, [blob], outputs=[httpclient.InferRequestedOutput(n) for n in wanted])
    names = sorted(out["name"] for out in result.get_response()["outputs"])
    assert names == sorted(wanted)
    logits, labels, scores = _expected(predictor, blob)
    if "LOGITS" in wanted:
        np.testing.assert_allclose(result.as_numpy("LOGITS")[0], logits, rtol=0, atol=1e-5)
    if "TOPK_LABELS" in wanted:
        assert [v.decode() for v in result.as_numpy("TOPK_LABELS")[0]] == labels


@pytest.mark.parametrize("protocol", ["v2-http", "v2-grpc"])
def test_validate_url_passes_the_generated_repository_over_both_protocols(server, demo_artifacts, tmp_path, protocol):
    from vitdeploy.client.served_check import check_served
    from vitdeploy.runtime.artifacts import sha256_file

    url = server.grpc_url if protocol == "v2-grpc" else server.http_url
    check = check_served(demo_artifacts, url, protocol=protocol, model=NAME, report_path=tmp_path / "drift.json")
    assert check.passed, check.row.failures
    assert check.server_sha256 == sha256_file(demo_artifacts / "manifest.json")  # the ensemble's parameters
    assert (check.backend, check.backend_source) == ("ort", "server")  # _ort_python: the runtime's ort backend
    assert check.row.metrics["top1_agreement"] == 1.0 and check.row.metrics["max_abs_diff"] < 1e-4


def test_validate_url_catches_an_edited_resize_filter_and_names_it(server, tampered, tmp_path):
    from vitdeploy.client.served_check import check_served

    check = check_served(tampered["export"], server.http_url, protocol="v2-http", model=TAMPERED, write_report=False)
    assert check.status == "failed"
    assert any(f.startswith("max_abs_diff") for f in check.row.failures)  # the answers drift...
    (named,) = [f for f in check.row.failures if "preprocessing" in f]  # ...and the edit is named
    assert f"model {TAMPERED}_preprocess" in named and "interpolation 'nearest'" in named
    with pytest.raises(Exception, match="failed: .*interpolation"):
        check.raise_for_failures()


def test_the_bundled_server_is_a_real_tritonserver(server: BundledTriton):
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live() and client.is_model_ready(NAME)
    meta = client.get_server_metadata()
    assert meta["name"] == "triton" and meta["version"].startswith("2.")
    model = client.get_model_metadata(NAME)
    assert [i["name"] for i in model["inputs"]] == ["IMAGES"]
    assert [o["name"] for o in model["outputs"]] == ["LOGITS", "TOPK_LABELS", "TOPK_SCORES"]


def test_answers_equal_the_predictor_over_http_and_grpc_from_16_concurrent_clients(server, predictor, images):
    expected = {name: _expected(predictor, blob) for name, blob in images.items()}
    jobs = [(proto, name) for proto in ("http", "grpc") for name in images]

    def one(job):
        proto, name = job
        result = (_http_infer if proto == "http" else _grpc_infer)(server, [images[name]])
        logits, labels, scores = _answer(result)
        return job, (logits[0], labels[0], scores[0])

    with ThreadPoolExecutor(16) as pool:
        for (proto, name), got in pool.map(one, jobs):
            _assert_same(got, expected[name], f"{proto} {name}")
    # Several images in one request: one answer row per image, in order.
    names = ["astronaut.jpg", "digit3_0339.jpg", "digit7_1330.png"]
    logits, labels, scores = _answer(_http_infer(server, [images[n] for n in names]))
    for i, name in enumerate(names):
        _assert_same((logits[i], labels[i], scores[i]), expected[name], f"batched {name}")


def test_preprocess_model_is_the_runtimes_preprocessing_bit_for_bit(server, predictor, images):
    out = httpclient.InferRequestedOutput("PIXEL_VALUES", binary_data=True)
    for name in ("astronaut.jpg", "camera.jpg", "digit0_0276.png", "digit5_0937.jpg"):
        got = _http_infer(server, [images[name]], model=f"{NAME}_preprocess", outputs=[out]).as_numpy("PIXEL_VALUES")
        want = predictor.preprocess([images[name]])
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got, want), name


def _bad_inputs(images: dict[str, bytes]) -> dict[str, tuple[list[bytes], str]]:
    from PIL import Image

    jpeg = images["astronaut.jpg"]
    return {
        "empty": ([b""], "empty"),
        "not an image": ([b"hello, this is text, not a picture"], "not a recognised image"),
        "truncated": ([jpeg[: len(jpeg) // 3]], "truncated"),
        "bomb": ([_png(Image.new("RGB", (1000, 1000), "white"))], "refused before decoding"),
        "one bad among good": ([images["coffee.jpg"], b"\x89PNG\r\n\x1a\n broken"], "IMAGES[1]"),
        "too many images": ([images["digit0_0276.png"]] * 33, "batch-size must be <= 32"),
    }


def _status(exc: InferenceServerException) -> str:
    return str(exc.status())


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_bad_images_fail_only_their_own_request_while_good_traffic_goes_on(server, predictor, images, proto, tmp_path):
    infer = _http_infer if proto == "http" else _grpc_infer
    good = ["astronaut.jpg", "chelsea.jpg", "rocket.jpg", "digit1_0527.png", "digit9_1704.jpg"] * 4
    bad = _bad_inputs(images)
    expected = {name: _expected(predictor, images[name]) for name in set(good)}
    jobs = [("good", name) for name in good] + [("bad", name) for name in bad] * 2
    jobs = jobs[::2] + jobs[1::2]  # interleave

    def one(job):
        kind, name = job
        try:
            result = infer(server, [images[name]] if kind == "good" else bad[name][0])
        except InferenceServerException as exc:
            return job, exc
        return job, result

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, jobs))
    for (kind, name), res in results:
        if kind == "good":
            assert not isinstance(res, InferenceServerException), f"{name}: {res}"
            logits, labels, scores = _answer(res)
            _assert_same((logits[0], labels[0], scores[0]), expected[name], f"good {name} beside bad traffic")
            continue
        assert isinstance(res, InferenceServerException), f"{name} was answered"
        message = res.message()
        assert bad[name][1] in message, f"{name}: {message}"
        assert (
            "\n" not in message
            and "Traceback" not in message
            and all(str(r) not in message for r in server.repositories)
        )
        assert "/tmp" not in message and "site-packages" not in message
        assert _status(res) in ("400", "StatusCode.INVALID_ARGUMENT"), f"{name}: {_status(res)} {message}"


def test_requests_beyond_the_queue_get_503_at_once_and_the_rest_are_answered(server, predictor, images):
    """A queue of one request: with the model's stub processes held, the requests beyond what the model
    admits (a batch in its instance and the one queued) are refused at once, whatever the machine's
    speed; released, the admitted ones are answered as the Predictor answers them."""
    blob = images["chelsea.jpg"]
    want = _expected(predictor, blob)
    stubs = triton_stub_pids(str(server.repositories[1]))
    results, early = answered_while_held(
        stubs, [lambda: _http_infer(server, [blob], model=SMALL_QUEUE)] * 64, accepted_at_most=32
    )
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    answered = [r for r in results if not isinstance(r, Exception)]
    assert len(refused) >= 32 and answered, f"{len(refused)} refused, {len(answered)} answered: {results[:3]}"
    assert len(refused) + len(answered) == len(results), [r for r in results if isinstance(r, Exception)][:3]
    assert all(isinstance(results[i], InferenceServerException) for i in early)
    for exc in refused:
        assert _status(exc) == "503", f"{_status(exc)} {exc.message()}"
        assert "queue" in exc.message()
    for res in answered:
        logits, labels, scores = _answer(res)
        _assert_same((logits[0], labels[0], scores[0]), want, "answered beside refused requests")


def test_the_readmes_restricted_apis_fence_every_route_but_health(demo_artifacts, tmp_path, images):
    """The repository README's `tritonserver` flags, run on the bundled server: without the header every
    API but health is refused (HTTP and gRPC), with it the model answers; a probe needs nothing."""
    _require_triton_env()
    from vitdeploy.base.config import parse_config
    from vitdeploy.serve.triton.readme import GRPC_PREFIX, RESTRICTED_APIS, TOKEN_HEADER
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    token = "triton-token-for-the-tests-0123456789"
    cfg = parse_config({"triton": {"inference": "ort_python"}})
    repo = build_triton_repo(demo_artifacts, tmp_path / "repo", settings_from_config(cfg)).path
    readme = (repo / "README.md").read_text()
    assert f"GROUPS={','.join(RESTRICTED_APIS)}" in readme and f'"$GROUPS:{TOKEN_HEADER}=' in readme
    fence = f"{','.join(RESTRICTED_APIS)}:{TOKEN_HEADER}={token}"
    flags = [f"--http-restricted-api={fence}", f"--grpc-restricted-protocol={fence}"]
    blob = images["chelsea.jpg"]
    data = np.array([[blob]], dtype=object)
    with BundledTriton(VENV, repo, load=[NAME], extra_args=flags) as triton:
        for module, url, header in (
            (httpclient, triton.http_url, TOKEN_HEADER),
            (grpcclient, triton.grpc_url, GRPC_PREFIX + TOKEN_HEADER),  # Triton prefixes restricted gRPC headers
        ):
            assert header in readme
            client = module.InferenceServerClient(url)
            assert client.is_server_live() and client.is_server_ready()  # health stays open
            inp = module.InferInput("IMAGES", list(data.shape), "BYTES")
            inp.set_data_from_numpy(data)
            for call in (
                lambda **kw: client.infer(NAME, [inp], **kw),
                lambda **kw: client.get_model_metadata(NAME, **kw),
            ):
                with pytest.raises(InferenceServerException) as refused:
                    call()
                assert header in refused.value.message(), refused.value.message()
                with pytest.raises(InferenceServerException):
                    call(headers={header: "not-the-token"})
            result = client.infer(NAME, [inp], headers={header: token})
            assert result.as_numpy("LOGITS").shape == (1, 10)
            client.close()


def test_an_embedding_export_answers_its_vectors_as_the_ort_backend_does(embedding_artifacts: Path, images, tmp_path):
    """A headless checkpoint's export on the bundled tritonserver: the ensemble's outputs are EMBEDDINGS FP32
    [N, D], over HTTP (binary and JSON) and gRPC, equal to the in-process `ort` Predictor's vectors, and (the export
    has its patch tokens) PATCH_TOKENS FP32 [N, P, D], equal to its patch tokens, when named."""
    _require_triton_env()
    from vitdeploy.base.config import parse_config
    from vitdeploy.runtime.predictor import Predictor
    from vitdeploy.serve.protocol import model_name
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    cfg = parse_config({"runtime": {"max_image_pixels": MAX_PIXELS}, "triton": {"inference": "ort_python"}})
    repo = build_triton_repo(embedding_artifacts, tmp_path / "repo", settings_from_config(cfg))
    manifest = json.loads((embedding_artifacts / "manifest.json").read_text())
    name, dim = model_name(manifest["name"]), manifest["io"]["output"]["shape"][1]
    chosen = ["astronaut.jpg", "coffee.jpg", "digit3_0339.jpg", "digit7_1330.png"]
    with Predictor.from_artifacts(embedding_artifacts, backend="ort", max_pixels=MAX_PIXELS) as predictor:
        want = {n: predictor.embed([images[n]])[0] for n in chosen}
        _, tokens = predictor.embed([images[n] for n in chosen], patch_tokens=True)
    patches = manifest["io"]["patch_tokens"]["shape"][1:]
    data = np.array([[images[n]] for n in chosen], dtype=object)
    with BundledTriton(VENV, repo.path, load=[name]) as triton:
        meta = httpclient.InferenceServerClient(triton.http_url).get_model_metadata(name)
        assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
            ("EMBEDDINGS", "FP32", [-1, dim]),
            ("PATCH_TOKENS", "FP32", [-1, *patches]),
        ]
        answers = {}
        for module, url, binary in (
            (httpclient, triton.http_url, True),
            (httpclient, triton.http_url, False),
            (grpcclient, triton.grpc_url, True),
        ):
            inp = module.InferInput("IMAGES", list(data.shape), "BYTES")
            inp.set_data_from_numpy(data)
            kwargs = {"binary_data": binary} if module is httpclient else {}
            out = module.InferRequestedOutput("EMBEDDINGS", **kwargs)
            result = module.InferenceServerClient(url).infer(name, [inp], outputs=[out])
            answers[f"{module.__name__} binary={binary}"] = result.as_numpy("EMBEDDINGS")
        inp = httpclient.InferInput("IMAGES", list(data.shape), "BYTES")
        inp.set_data_from_numpy(data)
        asked = [httpclient.InferRequestedOutput("PATCH_TOKENS", binary_data=True)]
        got = httpclient.InferenceServerClient(triton.http_url).infer(name, [inp], outputs=asked)
        np.testing.assert_allclose(got.as_numpy("PATCH_TOKENS"), tokens, rtol=0, atol=1e-5)
    for how, vectors in answers.items():
        assert vectors.dtype == np.float32 and vectors.shape == (len(chosen), dim), how
        for row, n in zip(vectors, chosen):
            np.testing.assert_allclose(row, want[n], rtol=0, atol=1e-5, err_msg=f"{how} {n}")


def test_an_export_for_several_sizes_answers_at_the_size_a_request_asks(sized_artifacts: Path, images, tmp_path):
    """The tiny DINOv2 exported at 28, 42 and 56 px on the bundled tritonserver: a request's parameters.image_size
    reaches the preprocessing through the ensemble; the vectors at 28 and at the base size (no parameter) are the
    `ort` Predictor's at that size; a size not listed is refused naming the sizes that work."""
    _require_triton_env()
    from vitdeploy.base.config import parse_config
    from vitdeploy.runtime.predictor import Predictor
    from vitdeploy.serve.protocol import model_name
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    cfg = parse_config({"runtime": {"max_image_pixels": MAX_PIXELS}, "triton": {"inference": "ort_python"}})
    repo = build_triton_repo(sized_artifacts, tmp_path / "repo", settings_from_config(cfg))
    name = model_name(json.loads((sized_artifacts / "manifest.json").read_text())["name"])
    blob = images["coffee.jpg"]
    with Predictor.from_artifacts(sized_artifacts, backend="ort", max_pixels=MAX_PIXELS) as predictor:
        want = {size: predictor.at_size(size).embed([blob])[0] for size in (28, 56)}
    data = np.array([[blob]], dtype=object)
    with BundledTriton(VENV, repo.path, load=[name]) as triton:
        for module, url in ((httpclient, triton.http_url), (grpcclient, triton.grpc_url)):
            client = module.InferenceServerClient(url)
            inp = module.InferInput("IMAGES", list(data.shape), "BYTES")
            inp.set_data_from_numpy(data)
            asked = [module.InferRequestedOutput("EMBEDDINGS")]
            for size, params in ((28, {"image_size": 28}), (56, None)):
                got = client.infer(name, [inp], outputs=asked, parameters=params).as_numpy("EMBEDDINGS")[0]
                np.testing.assert_allclose(got, want[size], rtol=0, atol=1e-4, err_msg=f"{module.__name__} {size}")
            with pytest.raises(InferenceServerException, match="sizes that work: 28, 42, 56"):
                client.infer(name, [inp], outputs=asked, parameters={"image_size": 35})


def _readme_switch(repo: Path) -> list[str]:
    """The bash block of the repository README's "A new version" section, cut at its numbered comments, each
    part after the lines before the first (its variables)."""
    section = (repo / "README.md").read_text().split("## A new version of the model", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    parts: list[list[str]] = [[]]
    for line in block.splitlines():
        if line.startswith(("# 1.", "# 2.", "# 3.")):
            parts.append([])
        parts[-1].append(line)
    assert len(parts) == 4, block
    return ["\n".join(parts[0] + part) for part in parts[1:]]


def test_a_new_export_switches_in_as_version_2_under_load_without_a_failed_request(
    server: BundledTriton, versioned: Path, tiny_artifacts, images
):
    """`triton-repo --new-version` writes a second export (another seed: other answers) as version 2 of every model
    while the server runs version 1; the README's steps, run as written (curl against the server) under a load of
    three HTTP clients that counts every answer: the steps load version 2, the ensemble's reload switches, version 1
    is retired. Not one request fails; every answer is one export's, the first's until the switch, the second's
    to every request sent after it (images the two answer differently); the ensemble names the second export's
    sha256. (Triton's HTTP answer says model_version 2 already once the steps have a version 2: it is not the
    ensemble's version.)"""
    import subprocess

    from vitdeploy.base.config import parse_config
    from vitdeploy.runtime.artifacts import sha256_file
    from vitdeploy.runtime.predictor import Predictor
    from vitdeploy.serve.triton.new_version import add_version
    from vitdeploy.serve.triton.repo import settings_from_config

    exports = {"1": tiny_artifacts(seed=0), "2": tiny_artifacts(seed=1)}
    top1 = {}
    for version, export in exports.items():
        with Predictor.from_artifacts(export, backend="ort") as p:
            top1[version] = {n: p.predict([b], top_k=1)[0].top_k[0][0] for n, b in images.items()}
    chosen = [n for n in images if top1["1"][n] != top1["2"][n]]
    assert len(chosen) >= 2, "the two exports must answer some images differently"
    added = add_version(exports["2"], versioned, settings_from_config(parse_config(TINY_TRITON)))
    assert (added.version, added.previous) == (2, 1)
    parts = _readme_switch(versioned)
    env = {**os.environ, "URL": server.http_url}
    load = CountedLoad(f"http://{server.http_url}", TINY, [images[n] for n in chosen], clients=3, triton=True)
    try:
        load.wait_for(30)
        for i, part in enumerate(parts):
            done = subprocess.run(["bash", "-ec", part], cwd=versioned, env=env, capture_output=True, text=True)
            assert done.returncode == 0, f"README step {i + 1}:\n{part}\n{done.stdout}\n{done.stderr}"
            if i == 0:
                switching = time.time()  # the steps' version 2 is loaded: the switch is next
            if i == 1:
                switched = time.time()
                assert sha256_file(exports["2"] / "manifest.json") in done.stdout  # the ensemble names export 2
            load.wait_for(30)
    finally:
        answers = load.stop()
    failed = [a for a in answers if a.status != "200"]
    assert not failed, f"{len(failed)} of {len(answers)} failed, e.g. {failed[:3]}"
    old, new = ([top1[v][chosen[a.image]] for a in answers] for v in ("1", "2"))
    before = [a.label == o for a, o in zip(answers, old) if a.at < switching]
    after = [a.label == n for a, n in zip(answers, new) if a.sent > switched]  # sent before: may come back after
    assert len(before) >= 30 and all(before), "before the switch: the first export's answers"
    assert len(after) >= 30 and all(after), "after the switch: the second export's answers"
    assert all(a.label in (o, n) for a, o, n in zip(answers, old, new)), "always one export's answer"
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready(f"{TINY}_ort_python", "1") and client.is_model_ready(f"{TINY}_ort_python", "2")
