"""`vitdeploy validate --url`: a running server's answers judged against eager PyTorch.

First against a server whose every answer the test decides (helpers/scripted_server.py, the tiny export): a
/predict server judged on its top-k scores, a flipped answer caught, a Triton ensemble whose preprocessing recipe
was edited named, a server that names no backend, nobody answering (exit 4). Then against a real `vitdeploy
serve` of the demo export on INT8 with a serve token (one for the module): it passes its own gate over /predict,
v2 HTTP and gRPC; without the token, on another export, past a gate it cannot pass, each fails in one line; the
check lands in drift-report.json's served section, which `validate` keeps and the report page shows. The
generated Triton repository on the bundled tritonserver: tests/serve/test_triton_server.py.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.scripted_server import ScriptedServer
from helpers.thresholds import IMPOSSIBLE

from vitdeploy.cli import main
from vitdeploy.client.protocols import PREDICT, V2_GRPC, V2_HTTP
from vitdeploy.client.served_check import check_served
from vitdeploy.runtime.artifacts import sha256_file
from vitdeploy.serve.auth import TOKEN_ENV
from vitdeploy.serve.protocol import config_parameters, export_parameters
from vitdeploy.serve.triton.local import free_port

TOKEN = "tests-served-token-5d1c0e9a77b2"


def _validate(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["validate", *args], env={TOKEN_ENV: None, **(env or {})})


@pytest.fixture(scope="module")
def tiny(tiny_artifacts, tmp_path_factory):
    """The tiny export (7 classes, 32 px), six unlabelled images, and eager PyTorch's logits of each image."""
    from PIL import Image

    from vitdeploy.runtime.predictor import Predictor

    folder = tmp_path_factory.mktemp("served_images")
    rng = np.random.default_rng(0)
    blobs = []
    for i in range(6):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (40 + i, 36, 3), dtype=np.uint8)).save(buf, format="PNG")
        (folder / f"img{i}.png").write_bytes(buf.getvalue())
        blobs.append(buf.getvalue())
    export = tiny_artifacts()
    with Predictor.from_artifacts(export, backend="torch") as eager:
        logits = {blob: eager.predict_logits(eager.preprocess([blob]))[0] for blob in blobs}
        labels = eager.labels
    return {"export": export, "images": folder, "logits": logits, "labels": labels}


def _record(logits: np.ndarray, labels: list[str], k: int = 3) -> dict:
    """/predict's record of one image: its top-k softmax scores, as `vitdeploy serve` answers."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    top = [{"label": labels[i], "index": int(i), "score": float(p[i])} for i in np.argsort(-p)[:k]]
    return {"path": "body", **top[0], "top_k": top}


def _scripted(tiny, *, backend="ort", flip: bool = False, preprocess: dict | None = None) -> ScriptedServer:
    """A server of the tiny export that states ``backend``; ``flip``: answers each image with the next image's
    answer; ``preprocess``: the recipe its Triton preprocessing model states (an ensemble), None: no ensemble."""
    sha = sha256_file(tiny["export"] / "manifest.json")
    blobs = list(tiny["logits"])
    config = {"name": "m", "parameters": config_parameters(export_parameters(sha, backend) if backend else {})}
    if preprocess is not None:
        config["ensemble_scheduling"] = {"step": [{"model_name": "m_preprocess"}, {"model_name": "m_onnx"}]}
    pre_config = {"name": "m_preprocess", "parameters": config_parameters({"preprocess": json.dumps(preprocess)})}

    def logits_of(body: bytes) -> np.ndarray:
        i = next(n for n, blob in enumerate(blobs) if body.endswith(blob))
        return tiny["logits"][blobs[(i + 1) % len(blobs) if flip else i]]

    def answer(method: str, path: str, body: bytes):
        if method == "GET":
            return (200, pre_config) if "m_preprocess" in path else (200, config)
        if path.endswith("/predict"):
            return 200, [_record(logits_of(body), tiny["labels"])]
        row = logits_of(body)
        return 200, {"outputs": [{"name": "LOGITS", "datatype": "FP32", "shape": [1, len(row)], "data": row.tolist()}]}

    return ScriptedServer(answer=answer)


def _check(tiny, server: ScriptedServer, protocol: str = PREDICT, **kwargs):
    return check_served(
        tiny["export"], server.url, protocol=protocol, model="m", images=tiny["images"], write_report=False, **kwargs
    )


def test_a_predict_server_is_judged_on_its_top_k_scores_and_a_flip_is_caught(tiny):
    with _scripted(tiny) as server:
        good = _check(tiny, server)
    assert good.passed and good.backend == "ort" and good.backend_source == "server"
    row = good.row
    assert row.metrics["top1_agreement"] == 1.0 and row.metrics["max_abs_diff"] < 1e-5
    assert "cosine" not in row.metrics  # top-k scores carry no vector worth a cosine
    with _scripted(tiny, flip=True) as server:
        bad = _check(tiny, server)
    assert bad.status == "failed" and bad.row.flipped  # each image answered with another's classes
    assert any(f.startswith("top1_agreement") for f in bad.row.failures)


def test_an_edited_preprocessing_behind_an_ensemble_is_named(tiny):
    from vitdeploy.runtime.artifacts import Artifacts

    recipe = Artifacts.open(tiny["export"]).preprocess.to_dict()
    with _scripted(tiny, preprocess=recipe) as server:
        assert _check(tiny, server, V2_HTTP).passed  # the export's own recipe: nothing to say
    edited = {**recipe, "mean": [0.4, 0.4, 0.4], "std": [0.2, 0.2, 0.2]}
    with _scripted(tiny, preprocess=edited) as server:
        check = _check(tiny, server, V2_HTTP)
    assert check.status == "failed"
    (named,) = [f for f in check.row.failures if "preprocessing" in f]
    assert "model m_preprocess" in named and "mean [0.4, 0.4, 0.4]" in named and "std [0.2, 0.2, 0.2]" in named


def test_a_manifest_whose_preprocessing_is_not_its_weights_is_judged_against_the_weights_recipe(tiny, tmp_path):
    from vitdeploy.client.served_check import eager_answers
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import BackendOptions
    from vitdeploy.runtime.predictor import Predictor

    eager = eager_answers(Artifacts.open(tiny["export"]), tiny["images"], None, BackendOptions(), None)
    with _scripted(tiny) as server:  # the export's eager answers, computed once beforehand (as a rollout does)
        assert _check(tiny, server, V2_HTTP, eager=eager).passed
    edited = tmp_path / "edited"
    shutil.copytree(tiny["export"], edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["preprocess"]["mean"] = [0.2, 0.2, 0.2]
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with Predictor.from_artifacts(edited, backend="torch") as served:  # what a server of the edited export answers
        logits = {blob: served.predict_logits(served.preprocess([blob]))[0] for blob in tiny["logits"]}
    with _scripted({**tiny, "export": edited, "logits": logits}) as server:
        check = _check({**tiny, "export": edited}, server, V2_HTTP)
    assert check.status == "failed"
    assert check.row.failures[0] == (
        "the manifest's preprocessing is not the one its weights were exported with: "
        "mean [0.2, 0.2, 0.2] (weights [0.5, 0.5, 0.5])"
    )
    assert any(f.startswith(("max_abs_diff", "top1_agreement")) for f in check.row.failures[1:]), check.row.failures


def test_a_server_that_names_no_backend_needs_backend(tiny):
    with _scripted(tiny, backend=None) as server:
        res = _validate("-a", str(tiny["export"]), "--url", server.url, "--images", str(tiny["images"]))
        assert res.exit_code == 2 and "--backend" in res.output and "vitdeploy_backend" in res.output
        check = _check(tiny, server, backend="ort-int8")
    assert check.passed and check.backend == "ort-int8" and check.backend_source == "--backend"
    assert check.row.threshold_set == "int8"


def _mid_rollout(tiny, live: str, asked: list[str]) -> ScriptedServer:
    """A server of model m in a rollout: versions 1 and 2, ``live`` answering unversioned requests (its
    statistics say so); only version 2 answers right, version 1 and unversioned inferences flip the classes (a
    request not pinned may meet the old version). ``asked``: the path of each request, in order."""
    good, bad = _scripted(tiny), _scripted(tiny, flip=True)
    for scripted in (good, bad):
        scripted.close()

    def answer(method: str, path: str, body: bytes):
        asked.append(path)
        if method == "GET" and path == "/v2/models/m":
            return 200, {"name": "m", "versions": ["1", "2"], "platform": "ray_serve"}
        if method == "GET" and path == "/v2/models/m/stats":
            return 200, {"model_stats": [{"name": "m", "version": live}]}
        return (good if "/versions/2/" in path else bad).answer(method, path, body)

    return ScriptedServer(answer=answer)


@pytest.mark.parametrize("protocol", [PREDICT, V2_HTTP])
def test_during_a_rollout_every_request_names_the_live_version_and_the_check_says_which(tiny, protocol):
    asked: list[str] = []
    with _mid_rollout(tiny, "2", asked) as server:
        check = _check(tiny, server, protocol)
    assert check.passed, check.row.failures
    sent = [p for p in asked if p.endswith(("/predict", "/infer"))]
    assert len(sent) == 6 and all(p.startswith("/v2/models/m/versions/2/") for p in sent), sent
    assert any("judged version 2 of model m" in n and "versions 1, 2" in n for n in check.notes), check.notes
    asked.clear()
    with _mid_rollout(tiny, "1", asked) as server:  # version 1 is live: pinned to it, and its flips are caught
        check = _check(tiny, server, protocol)
    assert check.status == "failed" and all("/versions/1/" in p for p in asked if p.endswith(("/predict", "/infer")))
    asked.clear()
    with _mid_rollout(tiny, "3", asked) as server:  # stats name no listed version: unpinned, and said
        check = _check(tiny, server, protocol)
    assert not any("/versions/" in p for p in asked) and any("does not say which is live" in n for n in check.notes)


def test_a_server_of_one_version_gets_unversioned_requests(tiny):
    asked: list[str] = []
    plain = _scripted(tiny)
    plain.close()
    with ScriptedServer(answer=lambda m, p, b: (asked.append(p), plain.answer(m, p, b))[1]) as server:
        check = _check(tiny, server, V2_HTTP)
    assert check.passed and not any("/versions/" in p for p in asked) and "/v2/models/m/infer" in asked
    assert not any("judged version" in n for n in check.notes)


def test_nobody_answering_is_exit_4_in_one_line(tiny):
    res = _validate("-a", str(tiny["export"]), "--url", f"http://127.0.0.1:{free_port()}")
    assert res.exit_code == 4
    (line,) = res.output.strip().splitlines()
    assert line.startswith("error: the server at http://127.0.0.1:") and "does not answer" in line


def test_options_of_a_served_check_need_url(tiny):
    res = _validate("-a", str(tiny["export"]), "--protocol", "v2-http")
    assert res.exit_code == 2 and "--url" in res.output


# ------------------------------------------------------------------------------------------ a real `vitdeploy serve`


@pytest.fixture(scope="module")
def export(demo_artifacts: Path, tmp_path_factory) -> Path:
    """A copy of the demo export (the same manifest: the same export), where the checks write their report."""
    out = tmp_path_factory.mktemp("served_export") / "export"
    shutil.copytree(demo_artifacts, out, ignore=shutil.ignore_patterns("drift-report.json", "report.html"))
    return out


@pytest.fixture(scope="module")
def serve(export: Path, tmp_path_factory):
    """`vitdeploy serve -b ort-int8` of the demo export with a serve token, HTTP and gRPC."""
    pytest.importorskip("ray.serve", reason="vitdeploy serve needs ray[serve] (pip install 'vitdeploy[serve]')")
    pytest.importorskip("tritonclient.grpc", reason="v2-grpc needs tritonclient[grpc]")
    from helpers.serve_process import ServeProcess

    grpc_port = free_port()
    cfg = tmp_path_factory.mktemp("served_cfg") / "pipeline.yaml"
    cfg.write_text(
        "runtime: {threads: 1}\n"
        f"serve: {{max_batch_size: 4, batch_wait_timeout_s: 0.002, metrics_port: {free_port()}, "
        f"grpc_port: {grpc_port}}}\n"
    )
    server = ServeProcess(
        export, cfg, "-b", "ort-int8", "--allow-insecure", env={TOKEN_ENV: TOKEN}, start_timeout_s=240
    )
    yield {PREDICT: server.url, V2_HTTP: server.url, V2_GRPC: f"127.0.0.1:{grpc_port}"}
    server.stop()


def _served_entries(export: Path) -> list[dict]:
    return json.loads((export / "drift-report.json").read_text())["served"]


@pytest.mark.integration
@pytest.mark.parametrize("protocol", [PREDICT, V2_HTTP, V2_GRPC])
def test_the_int8_server_passes_its_own_gate_over_every_protocol(serve, export, protocol):
    res = _validate("-a", str(export), "--url", serve[protocol], "--protocol", protocol, env={TOKEN_ENV: TOKEN})
    assert res.exit_code == 0, res.output
    assert "judged with the ort-int8 thresholds (said by the server)" in res.output
    (row,) = [line.split() for line in res.output.splitlines() if line.startswith("served ")]
    assert row[1] == "int8" and row[-3:] == ["PASS", "(int8", "thresholds)"]
    (entry,) = [e for e in _served_entries(export) if e["protocol"] == protocol]
    assert entry["status"] == "passed" and entry["backend"] == "ort-int8" and entry["threshold_set"] == "int8"
    assert entry["server"]["export_sha256"] == sha256_file(export / "manifest.json") == entry["export_sha256"]
    assert entry["images"]["evaluated"] == len(entry["per_image"]["max_abs_diff"]) > 0
    assert TOKEN not in res.output


@pytest.mark.integration
def test_without_the_token_the_check_says_where_serve_reads_it(serve, export):
    res = _validate("-a", str(export), "--url", serve[V2_HTTP], "--protocol", V2_HTTP)
    assert res.exit_code == 2 and TOKEN_ENV in res.output and "serve.token_file" in res.output
    res = _validate("-a", str(export), "--url", serve[V2_GRPC], "--protocol", V2_GRPC, env={TOKEN_ENV: "x" * 20})
    assert res.exit_code == 2 and "not the server's" in res.output


@pytest.mark.integration
def test_a_server_on_another_export_is_refused_in_one_line_naming_both(serve, export, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(export, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps(manifest, indent=3))  # the same files, another manifest
    res = _validate("-a", str(other), "--url", serve[V2_HTTP], "--protocol", V2_HTTP, env={TOKEN_ENV: TOKEN})
    assert res.exit_code == 3
    (error,) = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert sha256_file(export / "manifest.json") in error and sha256_file(other / "manifest.json") in error
    assert "refusing to certify" in error and "compared:" not in res.output
    (entry,) = _served_entries(other)
    assert entry["status"] == "refused"


@pytest.mark.integration
def test_an_int8_past_its_gate_fails_naming_the_metric(serve, export, tmp_path):
    cfg = tmp_path / "strict.yaml"
    cfg.write_text("validation:\n  int8: " + json.dumps(IMPOSSIBLE) + "\n")
    res = _validate(
        "-a", str(export), "--url", serve[V2_HTTP], "--protocol", V2_HTTP, "-c", str(cfg), env={TOKEN_ENV: TOKEN}
    )
    assert res.exit_code == 3
    assert "served FAIL max_abs_diff: expected <= 0" in res.output
    assert res.output.strip().splitlines()[-1].startswith(f"error: the server at {serve[V2_HTTP]} (v2-http) failed")


@pytest.mark.integration
def test_validate_keeps_the_served_checks_and_the_report_shows_them_beside_the_backends(serve, export):
    pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install 'vitdeploy[report]')")
    from vitdeploy.evaluate.report import write_report

    res = _validate("-a", str(export), "--url", serve[V2_HTTP], "--protocol", V2_HTTP, env={TOKEN_ENV: TOKEN})
    assert res.exit_code == 0, res.output
    res = _validate("-a", str(export), "-b", "ort")
    assert res.exit_code == 0, res.output
    doc = json.loads((export / "drift-report.json").read_text())
    assert [b["name"] for b in doc["backends"]] == ["ort"]
    assert any(e["protocol"] == V2_HTTP and e["status"] == "passed" for e in doc["served"])
    path, rec, facts = write_report(export, images=False)
    rows = [r.backend for r in facts.accuracy]
    assert "ort" in rows and f"served: {serve[V2_HTTP]} (v2-http)" in rows
    assert all(not p.backend.startswith("served") for p in rec.picks)  # a server is judged, never recommended
    assert f"served: {serve[V2_HTTP]} (v2-http)" in path.read_text()
