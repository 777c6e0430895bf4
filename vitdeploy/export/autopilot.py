"""The INT8 precision autopilot: quantize every MatMul/Gemm, judge the graph with
``validation.int8``, and return nodes to float until it passes.

Steps, each cumulative (what went back to float stays float):
1. everything quantized;
2. by op type: the Gemm nodes (the classifier head: little time, a direct hit on the logits);
3. by block: one transformer block's MatMuls at a time, the block whose MatMul inputs reach the
   largest magnitude on the calibration images first (U8 activations spread 256 steps over that
   range, so the widest range loses the most precision); blocks are the MatMuls in graph order
   split into ``depth`` equal runs (a ViT block has the same MatMuls as every other).
Every step's keep-float list and metrics are kept (the manifest records them). When even the last
step (every MatMul/Gemm float) fails, :class:`Int8GateError` carries the table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .._deps import require
from ..errors import ValidationError
from .quantize import QUANTIZED_OPS, Int8Result, quantize_prepared

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    name: str
    keep_float: tuple[str, ...]
    passed: bool
    metrics: dict[str, float]
    failures: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "keep_float": list(self.keep_float), "passed": self.passed,
                "metrics": {k: round(float(v), 6) for k, v in self.metrics.items()}, "failures": list(self.failures)}

    def line(self) -> str:
        m = self.metrics
        return (f"{self.name:<28} float {len(self.keep_float):>3}  max|diff| {m.get('max_abs_diff', float('nan')):.4g}  "
                f"cosine {m.get('cosine', float('nan')):.6f}  top1 {m.get('top1_agreement', float('nan')):.4f}  "
                f"{'PASS' if self.passed else 'FAIL'}")


class Int8GateError(ValidationError):
    """validation.int8 not met even with every MatMul/Gemm in float; ``steps`` holds the table."""

    def __init__(self, message: str, steps: Sequence[Step]) -> None:
        super().__init__(message)
        self.steps = tuple(steps)


@dataclass(frozen=True)
class AutopilotResult:
    result: Int8Result
    steps: tuple[Step, ...] = field(default_factory=tuple)


def _graph(pre: Path) -> Any:
    onnx = require("onnx", "the INT8 autopilot")
    return onnx.load(str(pre), load_external_data=False)


def blocks(pre: Path, depth: int) -> list[list[str]]:
    """The MatMul node names of each of ``depth`` blocks (graph order, equal runs); MatMuls left
    over when the count does not split evenly go into one more group."""
    matmuls = [n.name for n in _graph(pre).graph.node if n.op_type == "MatMul"]
    per = len(matmuls) // depth if depth > 0 else 0
    if per == 0:
        return [matmuls] if matmuls else []
    groups = [matmuls[i * per : (i + 1) * per] for i in range(depth)]
    return groups + ([matmuls[depth * per :]] if len(matmuls) > depth * per else [])


def block_order(pre: Path, groups: list[list[str]], calibration: np.ndarray | None, input_name: str) -> list[int]:
    """Indices of ``groups``, the widest activation range at a MatMul input first (graph order when unknown)."""
    if calibration is None or not len(groups):
        return list(range(len(groups)))
    from .precision import activation_peaks

    peaks = activation_peaks(pre, calibration, input_name)  # producer node name -> max |output|
    model = _graph(pre)
    producer = {out: n.name for n in model.graph.node for out in n.output}
    by_name = {n.name: n for n in model.graph.node}

    def score(group: list[str]) -> float:
        return max((peaks.get(producer.get(by_name[m].input[0], ""), 0.0) for m in group), default=0.0)

    scores = [score(g) for g in groups]
    return sorted(range(len(groups)), key=lambda i: -scores[i])


def run_autopilot(pre: Path, dst: Path, *, judge: Callable[[Path], Any], depth: int, input_name: str,
                  calibration: np.ndarray | None, **quantize: Any) -> AutopilotResult:
    """Quantize ``pre`` into ``dst`` with the fewest nodes in float that pass ``judge`` (a
    :class:`~vitdeploy.export.compare.Comparison` of a graph path); Int8GateError when none does."""
    steps: list[Step] = []

    def attempt(name: str, keep: tuple[str, ...]) -> Int8Result | None:
        res = quantize_prepared(pre, dst, input_name=input_name, calibration=calibration, keep_float=keep, **quantize)
        verdict = judge(dst)
        steps.append(Step(name, keep, verdict.passed, dict(verdict.metrics), tuple(verdict.failures)))
        log.info("int8 autopilot: %s", steps[-1].line())
        return res if verdict.passed else None

    keep: tuple[str, ...] = ()
    res = attempt("all MatMul/Gemm quantized", keep)
    if res is not None:
        return AutopilotResult(res, tuple(steps))
    model = _graph(pre)
    gemms = tuple(n.name for n in model.graph.node if n.op_type == "Gemm")
    if gemms:
        keep = gemms
        res = attempt("op type Gemm float", keep)
        if res is not None:
            return AutopilotResult(res, tuple(steps))
    groups = blocks(pre, depth)
    for i in block_order(pre, groups, calibration, input_name):
        keep = keep + tuple(groups[i])
        res = attempt(f"block {i} float" if i < depth else "other MatMuls float", keep)
        if res is not None:
            return AutopilotResult(res, tuple(steps))
    dst.unlink(missing_ok=True)
    table = "; ".join(f"{s.name}: {', '.join(s.failures[:2]) or 'pass'}" for s in steps)
    raise Int8GateError(f"validate-int8: validation.int8 not met even with every {'/'.join(QUANTIZED_OPS)} in float "
                        f"({len(steps)} steps: {table})", steps)


__all__ = ["AutopilotResult", "Int8GateError", "Step", "block_order", "blocks", "run_autopilot"]
