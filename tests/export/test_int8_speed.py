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

import numpy as np
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
class _Clock:
    """A clock that moves only when a fake backend runs: each run takes its backend's ``seconds``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Backend:
    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def run(self, batch):
        self.calls += 1
        self.clock.now += self.seconds


@pytest.mark.parametrize(
    "baseline_s, rounds",
    [(3.0, 1), (0.5, 1), (1.4, 3), (1.0, 3)],
    ids=["clearly-pays", "clearly-does-not", "near-the-minimum", "under-but-near"],
)
def test_a_clear_first_round_decides_alone_and_a_close_one_takes_the_median(monkeypatch, baseline_s, rounds):
    clock = _Clock()
    monkeypatch.setattr(int8_speed.time, "perf_counter", clock)
    int8, baseline = _Backend(clock, 1.0), _Backend(clock, baseline_s)

    check = int8_speed.time_against(int8, baseline, np.zeros((8, 3, 4, 4), np.float32), min_speedup=1.3)

    assert check.calls == rounds and int8.calls == baseline.calls == 1 + rounds  # a warm-up call each
    assert check.speedup == pytest.approx(baseline_s)
    assert ("one call each" in check.describe("ort")) == (rounds == 1)


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
    """2x fully quantized, min_speedup 1.9: the budget is the second step (the head Gemm in float, a
    sliver of the multiply-adds); the third would put a whole block in float, about half of the INT8 work
    (~1.3-1.7x: the last block runs for the class token only). The fully quantized graph and the largest
    step in the budget are judged, both fail, and the stage says so without building another step."""
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
    # (with a minimum every step meets, the largest step is every MatMul/Gemm in float: test_quantize_int8.py)

    # required: refused (exit 3, a gate that cannot be met with the speed), the rest of the export kept
    with pytest.raises(RefusedStagesError, match="cannot both be met") as refused:
        run_export(parse_config(_config(tiny_checkpoint, True, 1.9), None), tmp_path / "req", engine="skip")
    assert refused.value.exit_code == ValidationError.exit_code == 3
    assert json.loads((tmp_path / "req" / "manifest.json").read_text())["export"]["refused"][0]["stage"] == "int8"


# -- INT8 against FP16 on the GPU (model.int8.trt.onnx and model.int8.engine) ------------------------


def _gpu_doubles(monkeypatch, probe: float, shipped: float) -> list[str]:
    """What cannot run here replaced (no GPU, no TensorRT): an engine build writes its two files, and an
    INT8 engine timed against model.engine runs ``probe`` times as fast when it is the throw-away engine
    of the speed-first check, ``shipped`` times when it is model.int8.engine. Returns the engines timed.
    The doubles stand for TensorRT; what is tested is our logic around them (which is timed, when, and
    what ships), never that TensorRT builds or runs anything."""
    from vitdeploy.export import engine_stages
    from vitdeploy.export import tensorrt as trt_stage
    from vitdeploy.runtime import cuda

    timed: list[str] = []

    def build_engine(plan, progress=None):
        plan.engine_path.write_bytes(b"engine")
        plan.meta_path.write_text("{}")

    def time_engines(ctx, engine, meta):
        timed.append(engine.name)
        speedup = shipped if engine.name == "model.int8.engine" else probe
        return SpeedCheck(0.002, 0.002 / speedup, 8, 3, ctx.cfg.export.int8.min_speedup)

    monkeypatch.setattr(trt_stage, "build_engine", build_engine)
    monkeypatch.setattr(engine_stages, "time_engines", time_engines)
    monkeypatch.setattr(cuda, "gpu_identity", lambda device=None: cuda.GpuIdentity(0, "Test GPU", "9.0"))
    return timed


def _trt_table():
    """The real rows but the FP16 engine (its files written, as if built and validated on a GPU) and the
    INT8 engine's validation (it would run on the GPU): model.int8.trt.onnx's speed-first check and the
    INT8 engine's speed stage are the real code."""
    from dataclasses import replace

    from vitdeploy.export.core_stages import MODEL, ONNX, REFERENCE
    from vitdeploy.export.engine_stages import ENGINE_INT8
    from vitdeploy.export.precision_stages import INT8_TENSORRT
    from vitdeploy.export.rows import Artifact, Stage

    def fp16_engine(ctx, rec):
        made = []
        for role in ("engine", "engine-meta"):
            ctx.path(role).write_bytes(b"fp16 engine")
            made.append(Artifact(role, ctx.path(role)))
        return tuple(made)

    engine = Stage("engine", fp16_engine, roles=("engine", "engine-meta"))
    return [MODEL, ONNX, REFERENCE, engine, INT8_TENSORRT, replace(ENGINE_INT8, skip=lambda ctx: None, gate=None)]


def _trt_export(tmp_path, checkpoint, int8: dict, validation: dict | None, engine: str = "auto"):
    from vitdeploy.export.context import ExportContext
    from vitdeploy.export.pipeline import run_stages

    cfg = {
        "model": {"checkpoint": str(checkpoint)},
        "export": {"fp16": {"enabled": False}, "int8": {"enabled": False, **int8}},
        **({"validation": {"int8": validation}} if validation else {}),
    }
    ctx = ExportContext(parse_config(cfg, None), tmp_path, engine, None, heartbeat_s=None)
    run_stages(ctx, _trt_table())
    return ctx


#: a gate every graph passes
LOOSE = {
    "max_abs_diff": 1e9,
    "mean_abs_diff": 1e9,
    "min_cosine": -1.0,
    "min_top1_agreement": 0.0,
    "min_top5_overlap": 0.0,
}


@pytest.mark.integration
def test_an_int8_tensorrt_graph_that_cannot_beat_the_fp16_engine_stops_before_any_accuracy_work(
    tiny_checkpoint, tmp_path, monkeypatch
):
    timed = _gpu_doubles(monkeypatch, probe=1.05, shipped=2.0)
    judged = []
    monkeypatch.setattr("vitdeploy.export.precision_stages._Judge.__call__", lambda *a: judged.append(a) or None)
    ctx = _trt_export(tmp_path, tiny_checkpoint, {"tensorrt": True, "min_speedup": 1.3}, IMPOSSIBLE)
    assert timed == ["probe.engine"] and not judged  # timed once, fully quantized; not one judgement
    assert [r.stage for r in ctx.refused] == ["int8-trt"]  # asked for: refused (exit 4), the rest kept
    line = ctx.refused[0].line
    assert "INT8 does not pay on this GPU: 1.05x model.engine (FP16) fully quantized" in line, line
    assert "needs >= 1.3x; Test GPU (compute capability 9.0)" in line and ctx.refused[0].error.exit_code == 4
    assert "onnx-int8-trt" not in ctx.artifacts and "engine" in ctx.artifacts
    assert not any(tmp_path.glob("model.int8*")) and not any(tmp_path.glob(".int8-engine-*"))


@pytest.mark.integration
@pytest.mark.parametrize("engine, refused", [("auto", False), ("require", True)])
def test_an_int8_engine_no_faster_than_fp16_is_not_shipped(tiny_checkpoint, tmp_path, monkeypatch, engine, refused):
    """The graph's probe engine pays (2x), the engine finally built does not (1.1x): it is timed itself,
    and left out (auto) or refused (``--engine require`` with ``export.int8.tensorrt: true``: exit 4)."""
    timed = _gpu_doubles(monkeypatch, probe=2.0, shipped=1.1)
    ctx = _trt_export(tmp_path, tiny_checkpoint, {"tensorrt": True, "min_speedup": 1.3}, LOOSE, engine)
    assert timed == ["probe.engine", "model.int8.engine"]
    assert "onnx-int8-trt" in ctx.artifacts and "engine-int8" not in ctx.artifacts
    assert not (tmp_path / "model.int8.engine").exists()
    speed = next(s for s in ctx.stages if s.name == "speed-engine-int8")
    assert "1.10x model.engine (FP16)" in speed.reason and "not shipped" in speed.reason
    assert ctx.extra["int8_tensorrt"]["engine_speed"]["speedup"] == pytest.approx(1.1)
    assert bool(ctx.refused) is refused and (not refused or ctx.refused[0].error.exit_code == 4)

    # the same engine at 2x ships; and with min_speedup 0 nothing is timed at all
    timed = _gpu_doubles(monkeypatch, probe=2.0, shipped=2.0)
    ctx = _trt_export(tmp_path / "pays", tiny_checkpoint, {"tensorrt": True, "min_speedup": 1.3}, LOOSE, engine)
    assert "engine-int8" in ctx.artifacts and not ctx.refused and timed == ["probe.engine", "model.int8.engine"]
    timed = _gpu_doubles(monkeypatch, probe=0.5, shipped=0.5)
    ctx = _trt_export(tmp_path / "zero", tiny_checkpoint, {"tensorrt": True, "min_speedup": 0}, LOOSE, engine)
    assert "engine-int8" in ctx.artifacts and timed == []


@pytest.mark.integration
def test_without_an_fp16_engine_the_int8_tensorrt_graph_is_not_timed_and_says_so(tiny_checkpoint, tmp_path):
    from vitdeploy.export.context import ExportContext
    from vitdeploy.export.pipeline import run_stages

    table = [row for row in _trt_table() if row.name not in ("engine", "engine-int8")]
    cfg = {
        "model": {"checkpoint": str(tiny_checkpoint)},
        "validation": {"int8": LOOSE},
        "export": {"fp16": {"enabled": False}, "int8": {"enabled": False, "tensorrt": True, "min_speedup": 1.3}},
    }
    ctx = ExportContext(parse_config(cfg, None), tmp_path, "auto", None, heartbeat_s=None)
    run_stages(ctx, table)
    assert "onnx-int8-trt" in ctx.artifacts and "speed_first" not in ctx.extra["int8_tensorrt"]


def test_the_fp16_engine_is_built_before_the_int8_tensorrt_graph_it_is_timed_against():
    from vitdeploy.export.pipeline import STAGES

    names = [s.name for s in STAGES]
    assert names.index("engine") < names.index("int8-trt") < names.index("engine-int8")


def test_a_product_of_two_activations_past_an_unknown_operator_costs_nothing():
    """Shape inference stops at an operator it does not know: a MatMul by a weight after it still counts its
    token rows x K x N, but a MatMul of two activations (attention's products) has neither shapes nor weights.
    It counts 0, so the estimate stays optimistic: the autopilot returns such products to float first, and
    a cost left out only raises the INT8 share of the steps where they are float."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="projection"),  # [1, 4, 8] x [8, 8]
        helper.make_node("Mystery", ["a"], ["q"], name="unknown_q", domain="test.unknown"),
        helper.make_node("Mystery", ["a"], ["k"], name="unknown_k", domain="test.unknown"),
        helper.make_node("MatMul", ["q", "k"], ["scores"], name="scores"),
        helper.make_node("MatMul", ["scores", "w"], ["y"], name="after"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("test.unknown", 1)]
    costs = multiply_adds(helper.make_model(graph, opset_imports=opsets), ("MatMul", "Gemm"))
    assert costs == {"projection": 4 * 8 * 8, "scores": 0.0, "after": 4 * 8 * 8}
    assert int8_share(costs, ("scores",)) == 1.0
