"""The export's ``bf16`` row: a verdict on model.onnx at BF16 in OpenVINO (``validate-bf16``), where OpenVINO and
BF16 math are here; never a reason to fail the export or lose an artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.thresholds import IMPOSSIBLE

from vitdeploy.base.vocab import OPENVINO_BF16, VALIDATE_BF16
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.backends import backend_unavailable_reason

pytestmark = pytest.mark.integration

#: the demo model at its smallest: the graphs this row does not need are off
SMALL = {"batch": {"max": 4, "opt": 2}, "fp16": {"enabled": False}, "int8": {"enabled": False}}


def _stages(out: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}


def _needs_bf16() -> None:
    why = backend_unavailable_reason(OPENVINO_BF16)
    if why:
        pytest.skip(f"{OPENVINO_BF16} cannot run here: {why}")


def test_an_export_with_bf16_math_records_the_bf16_verdict(tmp_path: Path, export_config):
    from vitdeploy.export.pipeline import run_export

    _needs_bf16()
    result = run_export(export_config({"validation": {"noise_samples": 2}, "export": SMALL}), tmp_path, engine="skip")
    verdict = result.validation[VALIDATE_BF16]
    assert verdict["passed"] is True and verdict["backend"] == OPENVINO_BF16
    assert 0 < verdict["metrics"]["max_abs_diff"] <= verdict["thresholds"]["max_abs_diff"]  # BF16 is not FP32
    manifest = Artifacts.open(tmp_path).manifest
    assert manifest["validation"][VALIDATE_BF16]["passed"] is True
    assert _stages(tmp_path)[VALIDATE_BF16]["status"] == "passed"
    assert "onnx" in manifest["artifacts"]  # nothing written, nothing added: model.onnx is the graph


def test_a_bf16_miss_fails_its_stage_and_the_export_goes_on(tmp_path: Path, export_config):
    from vitdeploy.export.pipeline import run_export

    _needs_bf16()
    cfg = export_config({"validation": {"noise_samples": 2, "bf16": IMPOSSIBLE}, "export": SMALL})
    result = run_export(cfg, tmp_path, engine="skip")  # no error: a verdict only
    assert result.validation[VALIDATE_BF16]["passed"] is False
    stage = _stages(tmp_path)[VALIDATE_BF16]
    assert stage["status"] == "failed" and "max_abs_diff" in stage["reason"]
    artifacts = Artifacts.open(tmp_path)  # a valid export
    assert artifacts.manifest["validation"][VALIDATE_BF16]["passed"] is False
    assert artifacts.has("onnx") and not list(tmp_path.glob("*.rejected"))


def test_without_bf16_math_the_stage_is_skipped_with_the_reason(tmp_path: Path, export_config, monkeypatch):
    """A CPU whose OpenVINO lists no BF16 (simulated): one line says why, and the manifest has no verdict."""
    pytest.importorskip("openvino")
    from vitdeploy.export.pipeline import run_export
    from vitdeploy.runtime.backends import openvino as ov_backend

    monkeypatch.setattr(ov_backend, "cpu_capabilities", lambda: ("FP32", "INT8", "BIN", "EXPORT_IMPORT"))
    result = run_export(export_config({"validation": {"noise_samples": 2}, "export": SMALL}), tmp_path, engine="skip")
    assert VALIDATE_BF16 not in result.validation
    stage = _stages(tmp_path)["bf16"]
    assert stage["status"] == "skipped"
    assert "no BF16 math" in stage["reason"] and "FP32, INT8" in stage["reason"] and "\n" not in stage["reason"]
