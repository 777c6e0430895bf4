"""A stage that needs more memory than the machine has is refused in one line before it runs, never
killed half way (export/memory_budget.py). The machine's memory is what the test says it is (the two
readings of /proc are replaced): the refusal must not depend on the machine running the test."""

from __future__ import annotations

import json

import pytest

from vitdeploy.base import memory
from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import RefusedStagesError, StageUnavailableError
from vitdeploy.export import memory_budget
from vitdeploy.export.pipeline import run_export
from vitdeploy.runtime.artifacts import Artifacts

GB = 1 << 30


def _machine(monkeypatch, held: float, available: float) -> None:
    monkeypatch.setattr(memory, "rss_bytes", lambda: int(held))
    monkeypatch.setattr(memory, "available_bytes", lambda: int(available))


def test_a_stage_that_cannot_fit_names_what_it_needs_what_there_is_and_the_key(monkeypatch):
    _machine(monkeypatch, held=1 * GB, available=8.5 * GB)  # 9.5 GB for it
    weights, base = int(2.4 * GB), int(0.5 * GB)  # ViT-H's FP32 weights; what the export holds without them
    fp16, int8 = memory_budget.NEEDS["fp16"][0], memory_budget.NEEDS["int8"][0]
    assert 0.5 + fp16 * 2.4 <= 9.5 < 0.5 + int8 * 2.4  # what the lines below rely on
    memory_budget.check("fp16", weights, base)  # fits
    with pytest.raises(StageUnavailableError) as refused:
        memory_budget.check("int8", weights, base)
    message = str(refused.value)
    assert message.startswith(
        f"int8 needs about {0.5 + int8 * 2.4:.1f} GB (512.0 MB held without the model + {int8:g}x its 2.4 GB of FP32 "
        "weights, measured) and this machine has 9.5 GB for it (8.5 GB available, 1.0 GB held by the export)"
    ), message
    assert message.endswith("set export.int8.enabled: false")
    memory_budget.check("validate-onnx", 100 * GB, base)  # not a stage with a measured need: never refused
    # before the model is released (the onnx stage), what the export holds without it is what it holds now
    # less the model: 1.4 GB held with a 0.4 GB model
    onnx = memory_budget.NEEDS["onnx"][0]
    need = 1.0 + onnx * 0.4
    _machine(monkeypatch, held=1.4 * GB, available=(need - 1.4 + 0.05) * GB)
    memory_budget.check("onnx", int(0.4 * GB))  # fits
    _machine(monkeypatch, held=1.4 * GB, available=(need - 1.4 - 0.05) * GB)
    with pytest.raises(
        StageUnavailableError, match=rf"onnx needs about {need:.1f} GB \(1.0 GB held without the model"
    ):
        memory_budget.check("onnx", int(0.4 * GB))


@pytest.mark.integration
def test_an_export_goes_on_without_the_stages_that_cannot_fit(tiny_checkpoint, tmp_path, monkeypatch):
    """Room for 3.75x the weights over what the export holds: model.onnx (its need less the model, loaded
    already) and model.fp16.onnx are written, model.ort.onnx is refused (exit 4, the key in the line) and
    the optional INT8 graph is left out with its reason."""
    from vitdeploy.model.checkpoints import load_checkpoint

    weights = memory_budget.weight_bytes(load_checkpoint(tiny_checkpoint).model)
    needs = {stage: factor for stage, (factor, _) in memory_budget.NEEDS.items()}
    assert needs["onnx"] - 1 <= needs["fp16"] <= 3.75 < needs["ort-optimize"] <= needs["int8"]
    _machine(monkeypatch, held=100 * weights, available=3.75 * weights)
    with pytest.raises(RefusedStagesError, match="ort-optimize needs about .* set export.optimize: false") as refused:
        run_export(parse_config({"model": {"checkpoint": str(tiny_checkpoint)}}, None), tmp_path, engine="skip")
    assert refused.value.exit_code == StageUnavailableError.exit_code == 4
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert {"onnx", "onnx-fp16"} <= set(manifest["artifacts"])
    assert not {"onnx-ort", "onnx-int8"} & set(manifest["artifacts"])
    assert [r["stage"] for r in manifest["export"]["refused"]] == ["ort-optimize"]
    assert manifest["export"]["memory"] == {"weights_bytes": weights, "held_without_model_bytes": 100 * weights}
    int8 = next(s for s in manifest["stages"] if s["name"] == "int8")
    assert int8["status"] == "failed" and "int8 needs about" in int8["reason"]
    Artifacts.open(tmp_path)
