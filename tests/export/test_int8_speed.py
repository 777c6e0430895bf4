"""Speed first for INT8 (export/int8_speed.py): the fully quantized graph is timed before any accuracy
work, and the autopilot stops building steps that can no longer pay.

The estimate is checked against the multiply-adds a ViT's configuration implies; the autopilot's stop is
forced through ``export.int8.min_speedup`` with the clock replaced by a fixed 2x (a test double of the
timer: it checks our own logic, the same on every CPU; the real timing has its own tests in
test_quantize_int8.py, with a minimum no machine reaches).
"""

from __future__ import annotations

import json
import re

import onnx
import pytest
from helpers.thresholds import IMPOSSIBLE

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import RefusedStagesError, ValidationError
from vitdeploy.export import int8_speed
from vitdeploy.export.int8_speed import SpeedCheck, estimated_speedup, int8_share, multiply_adds
from vitdeploy.export.pipeline import run_export


def test_time_interpolates_linearly_in_the_int8_share():
    assert estimated_speedup(2.0, 1.0) == pytest.approx(2.0)
    assert estimated_speedup(2.0, 0.0) == pytest.approx(1.0)
    assert estimated_speedup(2.0, 0.5) == pytest.approx(1 / 0.75)
    assert estimated_speedup(0.8, 1.0) == pytest.approx(0.8)  # slower when fully quantized: slower with less
    costs = {"a": 3.0, "b": 1.0}
    assert int8_share(costs, ()) == 1.0 and int8_share(costs, ("a",)) == 0.25 and int8_share(costs, ("a", "b")) == 0
    assert int8_share({}, ()) is None  # no shapes: no estimate, every step is built and judged


@pytest.mark.integration
def test_multiply_adds_are_those_the_vit_configuration_implies(tiny_checkpoint, tmp_path):
    """The tiny checkpoint: 32 px, patch 8 (16 patches + the class token = 17 tokens), width 64, MLP 256,
    2 blocks, 7 classes. Per block: qkv 17x64x192, projection 17x64x64, the MLP 2 x 17x64x256, and the
    attention's two products 2 x 17x17x64 (heads x tokens x head width x tokens); the head 64x7."""
    cfg = {
        "model": {"checkpoint": str(tiny_checkpoint)},
        "export": {"fp16": {"enabled": False}, "int8": {"enabled": False}},
    }
    run_export(parse_config(cfg, None), tmp_path, engine="skip", heartbeat_s=None)
    t, d, m = 17, 64, 256
    block = t * d * 3 * d + t * d * d + 2 * t * d * m + 2 * t * t * d
    plain = multiply_adds(onnx.load(str(tmp_path / "model.onnx"), load_external_data=False), ("MatMul", "Gemm"))
    assert sum(plain.values()) == 2 * block + d * 7 and len(plain) == 2 * 6 + 1
    # model.ort.onnx: the attention is one fused operator (not a MatMul, not quantized) and the last block
    # runs for the class token only; past the fused operator the weights' K x N give every MatMul a cost
    fused = multiply_adds(onnx.load(str(tmp_path / "model.ort.onnx"), load_external_data=False), ("MatMul", "Gemm"))
    assert len(fused) == 2 * 6 + 1, fused  # q, k, v, projection, fc1, fc2 in each block, and the head
    assert all(cost > 0 for cost in fused.values()) and sum(fused.values()) <= 2 * (block - 2 * t * t * d) + d * 7


def _fixed_2x(monkeypatch) -> list[int]:
    """Every INT8 graph runs at exactly 2x its source; returns the list the timed batch sizes go to."""
    timed: list[int] = []

    def time_against(int8, baseline, batch, min_speedup, calls=3):
        timed.append(len(batch))
        return SpeedCheck(0.002, 0.001, len(batch), calls, min_speedup)

    monkeypatch.setattr(int8_speed, "time_against", time_against)
    return timed


def _config(checkpoint, enabled, min_speedup) -> dict:
    return {
        "model": {"checkpoint": str(checkpoint)},
        "validation": {"int8": IMPOSSIBLE},
        "export": {"fp16": {"enabled": False}, "int8": {"enabled": enabled, "min_speedup": min_speedup}},
    }


@pytest.mark.integration
def test_the_autopilot_stops_when_no_step_left_can_pass_and_pay(tiny_checkpoint, tmp_path, monkeypatch):
    """2x fully quantized, min_speedup 1.9: the first step (all INT8) and the second (the head Gemm in
    float, a sliver of the multiply-adds) are built and judged; the third would put a whole block in
    float, about half of the INT8 work (~1.3-1.7x: the last block runs for the class token only), so it
    is not built, and the stage says both failed."""
    timed = _fixed_2x(monkeypatch)
    out = tmp_path / "auto"
    result = run_export(
        parse_config(_config(tiny_checkpoint, "auto", 1.9), None), out, engine="skip", heartbeat_s=None
    )
    int8 = next(s for s in result.stages if s.name == "int8")
    assert int8.status == "failed" and "cannot both be met" in int8.reason, int8
    assert "missed validation.int8" in int8.reason and "under export.int8.min_speedup 1.9" in int8.reason
    assert re.search(r"block \d float would leave \d+% of the MatMul/Gemm multiply-adds INT8: ~1\.\d\dx", int8.reason)
    record = json.loads((out / "manifest.json").read_text())["export"]["int8"]
    assert [s["step"] for s in record["autopilot"]] == ["all MatMul/Gemm quantized", "op type Gemm float"]
    assert timed == [timed[0]]  # timed once, fully quantized, before the first judgement
    assert not any(out.glob("model.int8.onnx*"))

    # the same gate with a minimum the estimate always meets: every step is built and judged
    many = run_export(parse_config(_config(tiny_checkpoint, "auto", 1.0), None), tmp_path / "all", engine="skip")
    steps = json.loads((tmp_path / "all" / "manifest.json").read_text())["export"]["int8"]["autopilot"]
    assert len(steps) > 2 and "not met even with every" in next(s for s in many.stages if s.name == "int8").reason

    # required: refused (exit 3, a gate that cannot be met with the speed), the rest of the export kept
    with pytest.raises(RefusedStagesError, match="cannot both be met") as refused:
        run_export(parse_config(_config(tiny_checkpoint, True, 1.9), None), tmp_path / "req", engine="skip")
    assert refused.value.exit_code == ValidationError.exit_code == 3
    assert json.loads((tmp_path / "req" / "manifest.json").read_text())["export"]["refused"][0]["stage"] == "int8"
