"""Is the INT8 graph worth running? Its speed against the FP32 graph it was quantized from.

A validated INT8 graph that runs no faster than ``model.ort.onnx`` is a file the user carries for
nothing (or worse, one that is slower), so the int8 stage times both on the calibration batch (the
profile's ``opt`` images of it), a few calls each, interleaved so that slow drift of the machine
(frequency, other work) hits both alike, and ships the graph only at ``export.int8.min_speedup``.

Speed first (:class:`SpeedGuard`): a graph with fewer INT8 nodes is not faster than the fully
quantized one, so the fully quantized graph is timed before any accuracy work, and below the
minimum the stage stops at once. While the autopilot returns nodes to float, each step's speed is
estimated from the share of the MatMul/Gemm multiply-adds still INT8 (``share``) and the measured
full speed-up ``S``: time interpolates linearly, ``t = t_fp32 * ((1 - share) + share / S)``, which is
exact when every multiply-add gains alike and the other ops do not change (the Q/DQ pairs at the new
float/INT8 borders only make it slower, so the estimate never stops a step that could pay). A step
whose estimate is under the minimum is not built: no later step, with even less INT8, can pay.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..base._deps import require
from .onnx import without_weights

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeedCheck:
    """Median seconds per call of each graph on one batch, and the verdict against ``min_speedup``."""

    baseline_s: float
    int8_s: float
    batch: int
    calls: int
    min_speedup: float

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.int8_s if self.int8_s > 0 else float("inf")

    @property
    def worth_it(self) -> bool:
        return self.speedup >= self.min_speedup

    def describe(self, baseline: str) -> str:
        how = f"median of {self.calls} interleaved calls" if self.calls > 1 else "one call each, the margin clear"
        return (
            f"{self.speedup:.2f}x {baseline} at batch {self.batch} ({self.int8_s * 1e3:.1f} ms vs "
            f"{self.baseline_s * 1e3:.1f} ms, {how})"
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpeedCheck":
        """The check :meth:`to_dict` recorded (milliseconds as rounded there)."""
        return cls(
            d["baseline_ms"] / 1e3, d["int8_ms"] / 1e3, int(d["batch"]), int(d["calls"]), float(d["min_speedup"])
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "speedup": round(self.speedup, 3),
            "min_speedup": self.min_speedup,
            "batch": self.batch,
            "calls": self.calls,
            "int8_ms": round(self.int8_s * 1e3, 3),
            "baseline_ms": round(self.baseline_s * 1e3, 3),
        }


#: A first round whose ratio is this far from ``min_speedup`` (above it times this, or under it divided by
#: this) decides alone: a quiet machine's calls vary by a few percent (p90/p50 1.03-1.10 for ViT-B/16 at
#: 2 threads), a 1.5x margin is ten times that. Closer, the median of ``calls`` rounds decides. A fully
#: quantized ViT-B/16 runs 2.2-2.8x ``model.ort.onnx`` here against the default minimum of 1.3x: one round
#: (its FP32 calls at batch 8 are most of the stage's timing: ~2.5 s saved).
CLEAR = 1.5


def time_against(
    int8: Any, baseline: Any, batch: np.ndarray, min_speedup: float, calls: int = 3, clear: float = CLEAR
) -> SpeedCheck:
    """Time ``int8`` and ``baseline`` (backends with ``run``) on ``batch``: one warm-up call each, then up to
    ``calls`` rounds, the order alternating from round to round; after the first, only while the ratio is
    within ``clear`` of ``min_speedup`` (:data:`CLEAR`)."""
    int8.run(batch)
    baseline.run(batch)
    times: dict[int, list[float]] = {0: [], 1: []}
    runners = (int8, baseline)
    for i in range(calls):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.perf_counter()
            runners[which].run(batch)
            times[which].append(time.perf_counter() - start)
        ratio = times[1][0] / times[0][0] if times[0][0] > 0 else float("inf")
        if i == 0 and not min_speedup / clear < ratio < min_speedup * clear:
            break
    rounds = len(times[0])
    return SpeedCheck(statistics.median(times[1]), statistics.median(times[0]), len(batch), rounds, min_speedup)


def multiply_adds(model: Any, op_types: tuple[str, ...]) -> dict[str, float]:
    """Node name -> multiply-adds per image of each ``op_types`` node (MatMul/Gemm: rows x K x N, the
    batch axis 1), from ONNX shape inference on the graph without its weights.

    A MatMul of two activations (attention's Q·Kᵀ and weights·V, written out for INT8 or in the plain
    graph) is counted from both operands' shapes, as any other: [.., N, d] x [.., d, N] is (..) x N x d x N.
    What inference leaves symbolic is the batch (the first axis: 1) and, past a reshape, the token
    count: it is read off the token-wise weight MatMuls whose shapes were inferred (a ViT's are all
    the same). Inference also stops at operators it does not know (ONNX Runtime's fused attention in
    model.ort.onnx): a node after one, whose weights say K x N, gets those token rows, a Gemm (the head,
    on pooled features) one row. A node with neither shapes nor weights (a product of two activations
    past such an operator) counts 0: the autopilot returns attention products to float first, and a cost
    left out of the total that is float in a step only raises that step's estimated INT8 share, so the
    estimate still never stops a step that could pay."""
    onnx = require("onnx", "the INT8 speed estimate")
    try:
        graph = onnx.shape_inference.infer_shapes(without_weights(model)).graph
    except Exception as exc:  # noqa: BLE001 - an estimate only: without it every step is built and judged
        log.info("no INT8 speed estimate (shape inference: %s)", exc)
        return {}
    shapes: dict[str, list[int | None]] = {
        v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        for v in (*graph.value_info, *graph.input, *graph.output)
        if v.type.tensor_type.HasField("shape")
    }
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    shapes.update(weights)
    nodes = [n for n in model.graph.node if n.op_type in op_types and len(n.input) >= 2]
    token_rows = [
        shapes[n.input[0]][1]
        for n in nodes
        if n.op_type == "MatMul" and n.input[1] in weights and len(shapes.get(n.input[0]) or ()) == 3
    ]
    rows = float(np.median([r for r in token_rows if r])) if any(token_rows) else 1.0
    out: dict[str, float] = {}
    for node in nodes:
        a, b = shapes.get(node.input[0]), shapes.get(node.input[1])
        if a and b:
            a = [1 if i == 0 and d is None else (rows if d is None else d) for i, d in enumerate(a)]
            b = [rows if d is None else d for d in b]
            cols = b[0] if node.op_type == "Gemm" and _gemm_transposed_b(node) else b[-1]
            out[node.name] = float(np.prod(a[:-1])) * a[-1] * cols if len(a) > 1 else a[-1] * cols
        elif node.input[1] in weights:  # past an operator inference does not know
            out[node.name] = (rows if node.op_type == "MatMul" else 1.0) * float(np.prod(weights[node.input[1]]))
    return {n.name: out.get(n.name, 0.0) for n in nodes} if out else {}


def _gemm_transposed_b(node: Any) -> bool:
    return any(a.name == "transB" and a.i == 1 for a in node.attribute)


def int8_share(costs: dict[str, float], keep_float: tuple[str, ...]) -> float | None:
    """The share of the multiply-adds still INT8 when ``keep_float`` is float (1.0: fully quantized);
    None when the graph's shapes could not be inferred (no estimate)."""
    total = sum(costs.values())
    if total <= 0:
        return None
    kept = set(keep_float)
    return sum(c for name, c in costs.items() if name not in kept) / total


def estimated_speedup(full: float, share: float) -> float:
    """The speed-up of a graph with ``share`` of its multiply-adds INT8, from the fully quantized
    graph's measured ``full`` speed-up (the module docstring says why time interpolates linearly)."""
    return 1.0 / ((1.0 - share) + share / full) if full > 0 else 0.0


@dataclass(frozen=True)
class Timer:
    """How one INT8 target is timed: ``measure(path)`` times an INT8 graph against ``baseline`` (what
    it must beat: ``model.ort.onnx`` on the CPU, the FP16 engine ``model.engine`` on the GPU) and
    returns the SpeedCheck (None: it could not be timed, and logged why); ``device`` and ``machine``
    name where (the verdict is that machine's)."""

    measure: Callable[[Any], SpeedCheck | None]
    baseline: str
    device: str  # "CPU" | "GPU"
    machine: str  # "AMD EPYC, AVX512-VNNI" | "NVIDIA H100 ... (compute capability 9.0)"


def speed_verdict(
    ctx: Any,
    stage: str,
    path: Any,
    record: dict[str, Any],
    timer: Timer | None,
    required: bool,
    refuse: Callable[[str], Exception],
    reuse_first: bool = True,
    key: str = "speed",
) -> bool:
    """The ``stage`` (``speed-int8``, ``speed-engine-int8``) after an INT8 artifact passed validation:
    whether ``path`` ships. Timed by ``timer`` against its baseline (recorded under ``record[key]``),
    unless the fully quantized graph was timed already (``record["speed_first"]``), nothing was returned
    to float and ``reuse_first``: that measurement stands (an engine is always timed itself: its build
    may pick other kernels). Under ``export.int8.min_speedup`` the artifact is not shipped
    (``required``: ``refuse(why)`` is raised)."""
    minimum = ctx.cfg.export.int8.min_speedup
    with ctx.stage(stage) as rec:
        if minimum <= 0:
            rec.status, rec.reason = "skipped", "export.int8.min_speedup is 0: shipped without timing"
            return True
        if timer is None:
            rec.status, rec.reason = "skipped", "not timed: nothing here to time it against"
            return True
        timed = record.get("speed_first") if reuse_first and not record.get("keep_float") else None
        check = SpeedCheck.from_dict(timed) if timed else timer.measure(path)
        record[key] = dict(timed) if timed else check.to_dict()
        verdict = check.describe(timer.baseline) + (" (timed before validation: the same graph)" if timed else "")
        if check.worth_it:
            rec.reason = verdict
            return True
        why = (
            f"{path.name} not shipped: {verdict}, below export.int8.min_speedup {minimum:g}; INT8 does not pay "
            f"for this model on this {timer.device} (set export.int8.min_speedup: 0 to ship it anyway)"
        )
        if required:
            raise refuse(why)
        rec.status, rec.reason = "skipped", why
        record["shipped"] = False
        log.info("%s", why)
        return False


@dataclass
class SpeedGuard:
    """Speed first, for one INT8 graph and the autopilot's steps (see the module docstring).

    ``timer`` times a graph against its baseline (see :class:`Timer`); ``costs`` are
    :func:`multiply_adds` of the graph quantized; ``refuse(message)`` builds the error to raise."""

    timer: "Timer"
    costs: dict[str, float]
    min_speedup: float
    refuse: Callable[[str], Exception]
    full: SpeedCheck | None = None
    stopped: str = ""

    def check_full(self, path: Any) -> None:
        """Time the fully quantized graph (before any accuracy work); raise when it does not pay."""
        self.full = self.timer.measure(path)
        if self.full is None:  # could not be timed here (the timer says why): the final check decides
            return
        if not self.full.worth_it:
            raise self.refuse(
                f"INT8 does not pay on this {self.timer.device}: {self.full.speedup:.2f}x {self.timer.baseline} fully "
                f"quantized at batch {self.full.batch} (needs >= {self.min_speedup:g}x; {self.timer.machine}); set "
                "export.int8.min_speedup: 0 to ship it anyway"
            )

    def can_pay(self, step: str, keep_float: tuple[str, ...]) -> bool:
        """Whether the step that keeps ``keep_float`` in float can still reach the minimum (estimated)."""
        if self.full is None:
            return True  # the fully quantized graph could not be timed: every step is built and judged
        share = int8_share(self.costs, keep_float)
        if share is None:
            return True  # no estimate: the speed stage's measurement at the end decides
        guess = estimated_speedup(self.full.speedup, share)
        if guess >= self.min_speedup:
            return True
        self.stopped = (
            f"{step} would leave {share:.0%} of the MatMul/Gemm multiply-adds INT8: ~{guess:.2f}x "
            f"{self.timer.baseline} from the measured {self.full.speedup:.2f}x fully quantized, under "
            f"export.int8.min_speedup {self.min_speedup:g}"
        )
        return False


__all__ = [
    "SpeedCheck",
    "SpeedGuard",
    "Timer",
    "estimated_speedup",
    "int8_share",
    "multiply_adds",
    "speed_verdict",
    "time_against",
]
