"""`vitdeploy triton-repo --inference openvino`: the ensemble over Triton's own OpenVINO backend (CPU), on
model.onnx as the export validated it; every config parses into Triton's ModelConfig; refused where the export's
BF16 verdict failed (that backend runs BF16 on a CPU with BF16 math and cannot be asked for f32). Run on the
bundled tritonserver where it carries the openvino backend; skipped, saying so, where it does not (nvidia-pytriton's
has the python backend only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.base.vocab import OPENVINO_BF16, VALIDATE_BF16
from vitdeploy.cli import main
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.runtime.artifacts import sha256_file
from vitdeploy.serve.triton.local import bundled_backends, default_venv

pb = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="tritonclient not installed (pip install 'tritonclient[grpc]')"
)
from google.protobuf import text_format  # noqa: E402  (protobuf comes with tritonclient[grpc])

pytestmark = pytest.mark.integration

NAME = "vit-demo-digits"
OV = f"{NAME}_openvino"


def _repo(artifacts: Path, out: Path, *more: str):
    return CliRunner().invoke(
        main, ["triton-repo", "-a", str(artifacts), "-o", str(out), *more], catch_exceptions=False
    )


def _config(repo: Path, model: str) -> "pb.ModelConfig":
    return text_format.Parse((repo / model / "config.pbtxt").read_text(encoding="utf-8"), pb.ModelConfig())


def test_the_ensemble_calls_model_onnx_on_tritons_openvino_backend(demo_artifacts: Path, tmp_path: Path):
    repo = tmp_path / "repo"
    res = _repo(demo_artifacts, repo, "--inference", "openvino")
    assert res.exit_code == 0, res.output
    ov = _config(repo, OV)
    assert ov.backend == "openvino" and ov.default_model_filename == "model.onnx"
    assert [g.kind for g in ov.instance_group] == [pb.ModelInstanceGroup.KIND_CPU]
    assert ov.parameters["PERFORMANCE_HINT"].string_value == "LATENCY"
    assert ov.max_batch_size == json.loads((demo_artifacts / "manifest.json").read_text())["batch"]["max"]
    placed = repo / OV / "1" / "model.onnx"
    assert sha256_file(placed) == sha256_file(demo_artifacts / "model.onnx")  # the graph the export validated
    ensemble = _config(repo, NAME)
    assert [s.model_name for s in ensemble.ensemble_scheduling.step][1] == OV
    # judged (validate --url) by validation.bf16: the precision it runs at on a CPU with BF16 math
    assert ensemble.parameters["vitdeploy_backend"].string_value == OPENVINO_BF16
    readme = (repo / "README.md").read_text()
    assert f"`{OV}`" in readme and "cannot ask for f32" in readme


def test_without_the_flag_there_is_no_openvino_model(demo_artifacts: Path, tmp_path: Path):
    """A Triton without that backend would fail to load it: it is written only when asked for."""
    res = _repo(demo_artifacts, tmp_path / "repo")
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "repo" / OV).exists()


def test_refused_where_model_onnx_missed_validation_bf16(demo_artifacts: Path, tmp_path: Path):
    bad = tmp_path / "export"
    shutil.copytree(demo_artifacts, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["validation"][VALIDATE_BF16] = {"passed": False}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    res = _repo(bad, tmp_path / "repo", "--inference", "openvino")
    assert res.exit_code == 2 and "validate-bf16" in res.output and "cannot be asked for f32" in res.output
    assert not (tmp_path / "repo").exists()


def test_served_by_the_bundled_tritonserver_where_it_carries_the_openvino_backend(demo_artifacts, tmp_path):
    backends = bundled_backends()
    if "openvino" not in backends:
        pytest.skip(
            f"the bundled tritonserver ({default_venv()}) has no openvino backend (it carries: "
            f"{', '.join(backends) or 'nothing: not installed'}); the repository's configs are checked above"
        )
    httpclient = pytest.importorskip("tritonclient.http")
    from vitdeploy.runtime.predictor import Predictor
    from vitdeploy.serve.triton.local import BundledTriton

    repo = tmp_path / "repo"
    assert _repo(demo_artifacts, repo, "--inference", "openvino").exit_code == 0
    blobs = [p.read_bytes() for p in sorted(IMAGES_DIR.glob("*.png"))[:4]]
    with BundledTriton(default_venv(), repo, load=[NAME]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        data = np.array([[b] for b in blobs], dtype=object)
        inp = httpclient.InferInput("IMAGES", list(data.shape), "BYTES")
        inp.set_data_from_numpy(data, binary_data=True)
        got = client.infer(NAME, [inp]).as_numpy("LOGITS")
    with Predictor.from_artifacts(demo_artifacts, backend="ort") as p:
        want = p.predict_logits(p.preprocess(blobs))
    assert np.abs(got - want).max() <= 0.5  # validation.bf16's max |diff|: f32 or bf16, as the CPU has it
