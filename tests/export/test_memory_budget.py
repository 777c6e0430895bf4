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
    _machine(monkeypatch, held=3 * GB, available=15 * GB)  # 18 GB for it
    fp16, int8 = memory_budget.NEEDS["fp16"][0], memory_budget.NEEDS["int8"][0]
    assert fp16 * 2.4 > 18 and int8 * 2.4 > 18 and int8 * 1.2 < 18  # what the lines below rely on
    with pytest.raises(StageUnavailableError, match=f"fp16 needs about {fp16 * 2.4:.1f} GB"):
        memory_budget.check("fp16", int(2.4 * GB))
    with pytest.raises(StageUnavailableError) as refused:
        memory_budget.check("int8", int(2.4 * GB))
    message = str(refused.value)
    assert message.startswith(f"int8 needs about {int8 * 2.4:.1f} GB ({int8:g}x the model's 2.4 GB of FP32 weights")
    assert "this machine has 18.0 GB for it" in message and message.endswith("set export.int8.enabled: false")
    memory_budget.check("int8", int(1.2 * GB))  # fits
    memory_budget.check("validate-onnx", 100 * GB)  # not a stage with a measured need: never refused


@pytest.mark.integration
def test_an_export_goes_on_without_the_stages_that_cannot_fit(tiny_checkpoint, tmp_path, monkeypatch):
    """Room for 7.5x the weights: model.onnx and model.ort.onnx (6x, 6.5x) are written, FP16 (8x) is refused
    (exit 4, the key in the line) and the optional INT8 graph (10.5x) is left out with its reason."""
    from vitdeploy.model.checkpoints import load_checkpoint

    weights = memory_budget.weight_bytes(load_checkpoint(tiny_checkpoint).model)
    needs = {stage: factor for stage, (factor, _) in memory_budget.NEEDS.items()}
    assert needs["onnx"] <= needs["ort-optimize"] <= 7.5 < needs["fp16"] <= needs["int8"]
    _machine(monkeypatch, held=7.5 * weights, available=0)
    with pytest.raises(RefusedStagesError, match="fp16 needs about .* set export.fp16.enabled: false") as refused:
        run_export(parse_config({"model": {"checkpoint": str(tiny_checkpoint)}}, None), tmp_path, engine="skip")
    assert refused.value.exit_code == StageUnavailableError.exit_code == 4
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert {"onnx", "onnx-ort"} <= set(manifest["artifacts"])
    assert not {"onnx-fp16", "onnx-int8"} & set(manifest["artifacts"])
    assert [r["stage"] for r in manifest["export"]["refused"]] == ["fp16"]
    int8 = next(s for s in manifest["stages"] if s["name"] == "int8")
    assert int8["status"] == "failed" and "int8 needs about" in int8["reason"]
    Artifacts.open(tmp_path)
