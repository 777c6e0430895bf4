"""One `tritonclient`, two servers: the same calls against `vitdeploy serve` (Ray Serve) and the
generated repository on a real `tritonserver` get the same answers (labels, scores to 1e-6, shapes,
metadata, configuration tensors, status codes), and both READMEs' examples run against both.

The Triton side is also the test of the repository's self-containedness: the python models run in
a fresh environment built ONLY from what the repository ships (its wheels/ and requirements.txt;
pip fetches the pinned third-party packages from the index, as `docker build` would), never from
this checkout; the server binary is the one of the nvidia-pytriton wheel (python backend only, so
the ensemble goes over `_ort_python`).

Starts one `vitdeploy serve` (its own local Ray) and one tritonserver for the module.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient not installed (pip install 'tritonclient[http]')"
)
grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient not installed (pip install 'tritonclient[grpc]')"
)
pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
from helpers.serve_process import GRPC_WITHOUT_TOKEN, ServeProcess  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from vitdeploy.demo import IMAGES_DIR as DEMO_IMAGES_DIR  # noqa: E402
from vitdeploy.serve.triton.local import BundledTriton, _venv_python, default_venv, free_port  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = "vit-demo-digits"
MAX_PIXELS = 600_000
MAX_BATCH = 32  # the export's batch.max: the ensemble's max_batch_size, and serve.max_images_per_request
VENV = default_venv()
ROOT = Path(__file__).resolve().parents[2]
SERVERS = ["serve", "triton"]


def _require_triton_env() -> None:
    if _venv_python(VENV).exists():
        return
    reason = f"no {VENV} (create it with `make triton-env`): the bundled tritonserver is not installed"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _jpeg(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).convert("RGB").save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def images() -> dict[str, bytes]:
    data = pytest.importorskip("skimage.data", reason="scikit-image not installed")
    out = {f"{n}.jpg": _jpeg(getattr(data, n)()) for n in ("astronaut", "coffee", "chelsea")}
    for path in sorted(DEMO_IMAGES_DIR.iterdir())[:8]:
        if path.suffix in (".png", ".jpg"):
            out[path.name] = path.read_bytes()
    return out


@pytest.fixture(scope="module")
def predictor(demo_artifacts: Path):
    from vitdeploy.runtime.predictor import Predictor

    with Predictor.from_artifacts(demo_artifacts, backend="ort", max_pixels=MAX_PIXELS) as p:
        yield p


@pytest.fixture(scope="module")
def repo(demo_artifacts: Path, tmp_path_factory) -> Path:
    from vitdeploy.base.config import parse_config
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    cfg = parse_config(
        {
            "runtime": {"max_image_pixels": MAX_PIXELS},
            "triton": {"inference": "ort_python", "max_queue_delay_us": 2000, "decode_threads": 2},
        }
    )
    return build_triton_repo(demo_artifacts, tmp_path_factory.mktemp("x") / "repo", settings_from_config(cfg)).path


@pytest.fixture(scope="module")
def shipped_env(repo: Path, tmp_path_factory) -> Path:
    """A virtual environment with only the repository's requirements.txt and its vitdeploy wheel, for
    the Python of the bundled server's stubs (.venv-triton's)."""
    _require_triton_env()
    env = tmp_path_factory.mktemp("shipped") / "env"
    subprocess.run([str(_venv_python(VENV)), "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(_venv_python(env)), "install", "--quiet", "--no-input"]
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_FIND_LINKS")}
    for args in (["-r", str(repo / "requirements.txt")], ["--no-deps", *map(str, (repo / "wheels").glob("*.whl"))]):
        res = subprocess.run([*pip, *args], capture_output=True, text=True, env=clean, cwd=repo, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
    return env


@pytest.fixture(scope="module")
def triton(repo: Path, shipped_env: Path):
    with BundledTriton(VENV, repo, load=[NAME], python_env=shipped_env, log_verbose=1) as server:
        yield server


@pytest.fixture(scope="module")
def serve(demo_artifacts: Path, tmp_path_factory):
    port, grpc_port = free_port(), free_port()
    cfg = tmp_path_factory.mktemp("serve_cfg") / "pipeline.yaml"
    cfg.write_text(
        "runtime: {threads: 1, max_image_pixels: %d}\n"
        "serve: {max_batch_size: 8, batch_wait_timeout_s: 0.005, decode_threads: 2, metrics_port: %d,\n"
        "        max_images_per_request: %d, num_cpus_per_replica: 1, grpc_port: %d}\n"
        % (MAX_PIXELS, free_port(), MAX_BATCH, grpc_port)
    )
    server = ServeProcess(demo_artifacts, cfg, *GRPC_WITHOUT_TOKEN, port=port, start_timeout_s=240)
    assert f"gRPC:  [::]:{grpc_port}, every interface" in "\n".join(server.lines)
    yield {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{grpc_port}"}
    server.stop()


@pytest.fixture(params=SERVERS)
def url(request) -> str:
    """The HTTP address of each server in turn."""
    if request.param == "triton":
        return request.getfixturevalue("triton").http_url
    return request.getfixturevalue("serve")["http"]


@pytest.fixture(scope="module")
def both(serve, triton) -> dict[str, str]:
    return {"serve": serve["http"], "triton": triton.http_url}


@pytest.fixture(scope="module")
def both_grpc(serve, triton) -> dict[str, str]:
    return {"serve": serve["grpc"], "triton": triton.grpc_url}


def _client(url: str):
    return httpclient.InferenceServerClient(url, network_timeout=120.0, connection_timeout=120.0)


def _infer(url: str, blobs: list[bytes], shape: list[int] | None = None, **kwargs):
    data = np.array(blobs, dtype=object).reshape(shape or [len(blobs), 1])
    inp = httpclient.InferInput("IMAGES", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    return _client(url).infer(NAME, [inp], **kwargs)


def _expected(predictor, blobs: list[bytes]):
    logits = predictor.predict_logits(predictor.preprocess(blobs))
    preds = predictor.predictions_from_logits(logits, top_k=5)
    return (
        logits,
        [[label for label, _, _ in p.top_k] for p in preds],
        np.array([[s for _, _, s in p.top_k] for p in preds], dtype=np.float32),
    )


def _assert_answer(result, want, what: str) -> None:
    logits, labels, scores = want
    got_labels = [[v.decode() for v in row] for row in result.as_numpy("TOPK_LABELS")]
    assert result.as_numpy("LOGITS").shape == logits.shape and result.as_numpy("TOPK_SCORES").shape == scores.shape
    assert got_labels == labels, what
    np.testing.assert_allclose(result.as_numpy("TOPK_SCORES"), scores, rtol=0, atol=1e-6, err_msg=what)
    np.testing.assert_allclose(result.as_numpy("LOGITS"), logits, rtol=0, atol=1e-5, err_msg=what)


# ------------------------------------------------------------------------------------------ the shipped environment


def test_the_python_models_run_from_the_repositorys_wheel_and_pins_alone(triton, shipped_env: Path, repo: Path):
    code = "import vitdeploy, numpy; print(vitdeploy.__file__); print(numpy.__version__)"
    out = subprocess.run(
        [str(_venv_python(shipped_env)), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=shipped_env,
        env={"PATH": os.environ["PATH"]},
    ).stdout.split()
    assert Path(out[0]).is_relative_to(shipped_env) and not Path(out[0]).is_relative_to(ROOT)
    assert out[1].startswith("1.")  # numpy < 2, as the python stub needs
    direct = next(shipped_env.glob("lib/python*/site-packages/vitdeploy-*.dist-info/direct_url.json"))
    assert json.loads(direct.read_text())["url"].startswith(f"file://{repo}/wheels/")
    assert not any(str(ROOT) in p.read_text() for p in shipped_env.glob("lib/python*/site-packages/*.pth"))
    client = _client(triton.http_url)
    assert client.is_model_ready(NAME) and client.get_server_metadata()["name"] == "triton"
    # model_warmup ran while the inference model loaded (a failed warm-up fails the load, so READY means warm).
    log = triton.log_path.read_text(encoding="utf-8", errors="replace")
    warmed = re.findall(r"Generating warmup sample data for '(zeros_batch_\d+)'", log)
    assert sorted(set(warmed)) == ["zeros_batch_1", "zeros_batch_32", "zeros_batch_8"], warmed


# ------------------------------------------------------------------------------------------ same answers


def test_answers_equal_the_predictor_on_each_server(url, predictor, images):
    names = sorted(images)
    for name in names:
        _assert_answer(_infer(url, [images[name]]), _expected(predictor, [images[name]]), f"{url} {name}")
    _assert_answer(
        _infer(url, [images[n] for n in names]),
        _expected(predictor, [images[n] for n in names]),
        f"{url} batch of {len(names)}",
    )


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_answered_the_same(url, predictor, images, algorithm):
    blob = images["chelsea.jpg"]
    _assert_answer(
        _infer(url, [blob], request_compression_algorithm=algorithm),
        _expected(predictor, [blob]),
        f"{url} {algorithm}",
    )


def test_metadata_and_config_are_the_same_on_both(both, demo_artifacts: Path):
    meta = {s: _client(u).get_model_metadata(NAME) for s, u in both.items()}
    assert (
        meta["serve"]["inputs"]
        == meta["triton"]["inputs"]
        == [{"name": "IMAGES", "datatype": "BYTES", "shape": [-1, 1]}]
    )
    assert meta["serve"]["outputs"] == meta["triton"]["outputs"]
    tensors = {}
    for server, u in both.items():
        cfg = _client(u).get_model_config(NAME)
        tensors[server] = (
            cfg["max_batch_size"],
            [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]],
            [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]],
        )
    assert tensors["serve"] == tensors["triton"]
    assert tensors["serve"][1] == [("IMAGES", "TYPE_STRING", [1])]
    # Both say which export they answer with (its manifest's sha256) and on which backend, in the same form.
    from vitdeploy.runtime.artifacts import sha256_file
    from vitdeploy.serve.protocol import export_parameters, served_export

    stated = {server: served_export(_client(u).get_model_config(NAME)) for server, u in both.items()}
    assert (
        stated["serve"] == stated["triton"] == export_parameters(sha256_file(demo_artifacts / "manifest.json"), "ort")
    )


def test_statistics_count_requests_on_both(url, images):
    client = _client(url)
    before = client.get_inference_statistics(NAME)["model_stats"][0]["inference_stats"]
    _infer(url, [images["coffee.jpg"]])
    with pytest.raises(InferenceServerException):
        _infer(url, [b"not an image"])
    (entry,) = client.get_inference_statistics(NAME)["model_stats"]
    after = entry["inference_stats"]
    assert entry["name"] == NAME
    assert int(after["success"]["count"]) == int(before["success"]["count"]) + 1
    assert int(after["fail"]["count"]) >= int(before["fail"]["count"]) + 1
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert int(after[key]["count"]) > int(before[key]["count"]) and int(after[key]["ns"]) > int(before[key]["ns"])


# ------------------------------------------------------------------------------------------ same refusals


def _bad_calls(images: dict[str, bytes]) -> dict[str, object]:
    from PIL import Image

    jpeg = images["astronaut.jpg"]
    bomb = io.BytesIO()
    Image.new("RGB", (1000, 1000), "white").save(bomb, format="PNG")

    def fp32_input(u):
        inp = httpclient.InferInput("IMAGES", [1, 1], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 1), np.float32))
        return _client(u).infer(NAME, [inp])

    def wrong_name(u):
        inp = httpclient.InferInput("PIXELS", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[jpeg]], dtype=object))
        return _client(u).infer(NAME, [inp])

    return {
        "empty image": lambda u: _infer(u, [b""]),
        "not an image": lambda u: _infer(u, [b"hello, this is text, not a picture"]),
        "truncated": lambda u: _infer(u, [jpeg[: len(jpeg) // 3]]),
        "decompression bomb": lambda u: _infer(u, [bomb.getvalue()]),
        "one bad among good": lambda u: _infer(u, [images["coffee.jpg"], b"\x89PNG\r\n\x1a\n broken"]),
        "two images in one row": lambda u: _infer(u, [jpeg, jpeg], shape=[1, 2]),
        "FP32 instead of BYTES": fp32_input,
        "another input name": wrong_name,
        "more images than the batch limit": lambda u: _infer(u, [images["coffee.jpg"]] * (MAX_BATCH + 1)),
        "unknown model": lambda u: _client(u).infer(
            "no-such-model", [httpclient.InferInput("IMAGES", [1, 1], "BYTES")]
        ),
    }


def test_the_same_bad_inputs_get_the_same_status_codes(both, images):
    got: dict[str, dict[str, str]] = {}
    for what, call in _bad_calls(images).items():
        for server, u in both.items():
            with pytest.raises(InferenceServerException) as err:
                call(u)
            got.setdefault(what, {})[server] = str(err.value.status())
            assert "\n" not in err.value.message() and "Traceback" not in err.value.message(), (what, server)
    differ = {w: s for w, s in got.items() if s["serve"] != s["triton"]}
    assert not differ, f"status codes differ: {differ}"
    assert {w: s["serve"] for w, s in got.items()} == {w: "404" if w == "unknown model" else "400" for w in got}


# ------------------------------------------------------------------------------------------ the READMEs


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, re.S)


@pytest.mark.parametrize("readme", ["project", "repository"])
def test_the_readme_examples_run_against_both_servers(both, repo, images, tmp_path, readme, predictor):
    text = (ROOT / "README.md" if readme == "project" else repo / "README.md").read_text(encoding="utf-8")
    (block,) = [b for b in _python_blocks(text) if "tritonclient" in b and ".infer(" in b]
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(images["chelsea.jpg"])
    want = _expected(predictor, [images["chelsea.jpg"]])
    for server, u in both.items():
        code = re.sub(r'InferenceServerClient\("[^"]+"\)', f'InferenceServerClient("{u}")', block)
        code = code.replace('"cat.jpg"', repr(str(photo)))
        assert code != block
        scope: dict[str, object] = {}
        out = io.StringIO()
        from contextlib import redirect_stdout

        with redirect_stdout(out):
            exec(compile(code, f"{readme} README ({server})", "exec"), scope)  # noqa: S102 - the README's own code
        result = scope["result"]
        _assert_answer(result, want, f"{readme} README against {server}")
        assert want[1][0][0] in out.getvalue()


# ------------------------------------------------------------------------------------------ gRPC


def _grpc_infer(u: str, blobs: list[bytes], shape: list[int] | None = None, **kwargs):
    data = np.array(blobs, dtype=object).reshape(shape or [len(blobs), 1])
    inp = grpcclient.InferInput("IMAGES", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    return grpcclient.InferenceServerClient(u).infer(NAME, [inp], client_timeout=120, **kwargs)


def test_tritonclient_grpc_gets_the_same_answers_from_both(both_grpc, predictor, images):
    blobs = [images[n] for n in sorted(images)]
    want = _expected(predictor, blobs)
    for server, u in both_grpc.items():
        client = grpcclient.InferenceServerClient(u)
        assert client.is_server_live() and client.is_model_ready(NAME), server
        meta = client.get_model_metadata(NAME, as_json=True)
        assert meta["inputs"] == [{"name": "IMAGES", "datatype": "BYTES", "shape": ["-1", "1"]}], server
        cfg = client.get_model_config(NAME, as_json=True)["config"]
        assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [("IMAGES", "TYPE_STRING", ["1"])]
        _assert_answer(_grpc_infer(u, blobs[:1]), _expected(predictor, blobs[:1]), f"grpc {server} one")
        _assert_answer(_grpc_infer(u, blobs), want, f"grpc {server} batch")
        stats = client.get_inference_statistics(NAME, as_json=True)["model_stats"][0]["inference_stats"]
        assert int(stats["success"]["count"]) >= 2, server


@pytest.mark.parametrize("output", ["LOGITS", "TOPK_SCORES"])
def test_class_count_is_answered_alike_by_both(both, both_grpc, images, output):
    """The classification extension on a numeric output: b"value:index", largest first, from either server,
    over HTTP and gRPC (asked of TOPK_LABELS, tritonserver itself fails: refused by serve, see
    test_kserve_model_extensions.py)."""
    jpeg = images["chelsea.jpg"]
    http = {
        s: _infer(u, [jpeg], outputs=[httpclient.InferRequestedOutput(output, class_count=3)]) for s, u in both.items()
    }
    grpc = {
        s: _grpc_infer(u, [jpeg], outputs=[grpcclient.InferRequestedOutput(output, class_count=3)])
        for s, u in both_grpc.items()
    }
    answers = {
        f"{proto} {s}": r.as_numpy(output) for proto, by in (("http", http), ("grpc", grpc)) for s, r in by.items()
    }
    first = answers["http triton"]
    assert first.shape == (1, 3) and all(b":" in v for v in first.ravel())
    for what, got in answers.items():
        values = [[float(v.split(b":")[0]) for v in row] for row in got]
        want = [[float(v.split(b":")[0]) for v in row] for row in first]
        assert [[v.split(b":")[1] for v in row] for row in got] == [
            [v.split(b":")[1] for v in row] for row in first
        ], what
        np.testing.assert_allclose(values, want, atol=1e-4, err_msg=what)


def test_grpc_refusals_have_the_same_codes_on_both(both_grpc, images):
    jpeg = images["astronaut.jpg"]
    calls = {
        "not an image": lambda u: _grpc_infer(u, [b"hello, not a picture"]),
        "truncated": lambda u: _grpc_infer(u, [jpeg[: len(jpeg) // 3]]),
        "two images in one row": lambda u: _grpc_infer(u, [jpeg, jpeg], shape=[1, 2]),
        "unknown model": lambda u: grpcclient.InferenceServerClient(u).get_model_metadata("no-such-model"),
    }
    got: dict[str, dict[str, str]] = {}
    for what, call in calls.items():
        for server, u in both_grpc.items():
            with pytest.raises(InferenceServerException) as err:
                call(u)
            got.setdefault(what, {})[server] = str(err.value.status())
    assert all(s["serve"] == s["triton"] for s in got.values()), got
    assert got["unknown model"]["serve"] == "StatusCode.NOT_FOUND"
    assert got["not an image"]["serve"] == "StatusCode.INVALID_ARGUMENT"
