"""Precision autopilots: start from the fastest graph, judge it, and return nodes to float until
the gate passes. One mechanism (:func:`ladder` yields the steps, :func:`climb` walks them), used by

- INT8 (export/int8_autopilot.py, which spends its speed budget first and derives its steps from one
  quantized graph): ``model.int8.onnx`` for ONNX Runtime and ``model.int8.trt.onnx`` for TensorRT (a
  :class:`~vitdeploy.export.quantize.Placement` each), judged by ``validation.int8``;
- FP16 (:func:`run_fp16_autopilot`): ``model.fp16.onnx``, judged by ``validation.fp16``.

Steps, each cumulative (what went back to float stays float):
1. the start: everything in low precision except a floor. INT8: no floor; where the graph quantized
   has its attention products quantized (export/int8_attention.py), the next step returns them all to
   float ("attention float"), before anything else. FP16: the op types of
   ``export.fp16.keep_fp32_ops`` (LayerNormalization by default) and the nodes whose activations
   exceed ``max_abs_activation`` on the calibration images. The floor is not judged but imposed:
   the judge runs the graph in ONNX Runtime on the CPU, whose FP16 LayerNormalization accumulates
   in float32, while TensorRT, which compiles this very graph, warns that an FP16 LayerNorm after
   attention may overflow its variance; an activation past FP16's 65504 is an overflow, not drift;
2. by op type, the types of ``float_first`` present in the graph, one step each. INT8: the
   classifier head (Gemm: little time, a direct hit on the logits), and for TensorRT the patch
   embedding (Conv, the layer nearest the input). FP16 (:data:`FP16_FLOAT_FIRST`): the exponentials
   and reductions PyTorch's autocast runs in float32 (Softmax, ReduceMean, Pow, ...), then the head;
3. by block: one transformer block at a time, the block reading the widest values on the
   calibration images first (INT8 spreads 256 steps over that range; FP16 is nearest overflow
   there); blocks are the graph-order spans ending at every ``depth``-th run of MatMuls (a ViT
   block has the same MatMuls as every other); what follows the last block (final norm, head)
   comes last. INT8 returns a block's quantized ops, FP16 all its nodes.
Every step's keep-float list and metrics are kept (the manifest records them). When even the last
step fails, :class:`GateError` carries the table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..base.errors import ValidationError

log = logging.getLogger(__name__)

#: FP16's op types returned to float first (present ones only, in this order): the ops on PyTorch
#: autocast's float32 list (https://pytorch.org/docs/stable/amp.html, "CUDA Ops that can autocast
#: to float32") that a ViT graph contains, then the classifier head.
FP16_FLOAT_FIRST = ("Softmax", "ReduceMean", "ReduceSum", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Gemm")


@dataclass(frozen=True)
class Step:
    name: str
    keep_float: tuple[str, ...]
    passed: bool
    metrics: dict[str, float]
    failures: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.name,
            "keep_float": list(self.keep_float),
            "passed": self.passed,
            "metrics": {k: round(float(v), 6) for k, v in self.metrics.items()},
            "failures": list(self.failures),
        }

    def line(self) -> str:
        m = self.metrics
        return (
            f"{self.name:<28} float {len(self.keep_float):>3}  max|diff| {m.get('max_abs_diff', float('nan')):.4g}  "
            f"cosine {m.get('cosine', float('nan')):.6f}  top1 {m.get('top1_agreement', float('nan')):.4f}  "
            f"{'PASS' if self.passed else 'FAIL'}"
        )


class GateError(ValidationError):
    """The gate is not met even at the autopilot's last step; ``steps`` holds the table."""

    def __init__(self, message: str, steps: Sequence[Step]) -> None:
        super().__init__(message)
        self.steps = tuple(steps)


@dataclass(frozen=True)
class AutopilotResult:
    result: Any  # what the last step's ``make`` returned (an Int8Result, an Fp16Result)
    steps: tuple[Step, ...] = field(default_factory=tuple)


def _graph(path: Path) -> Any:
    """The graph at ``path`` without its initializers, none of them read (export/onnx_spans.py): what the
    steps are chosen from is its nodes; the weights are held by whatever quantizes or converts."""
    from .onnx_spans import scan

    return scan(path).model


# --------------------------------------------------------------------------------------------
# the steps


def block_spans(model: Any, depth: int) -> list[list[str]]:
    """Every node name of ``model`` in graph order, cut after the last MatMul of each of ``depth``
    equal runs of MatMuls; what follows the last block (and MatMuls left over when the count does
    not split evenly) is one more span."""
    names = [n.name for n in model.graph.node]
    matmuls = [i for i, n in enumerate(model.graph.node) if n.op_type == "MatMul"]
    per = len(matmuls) // depth if depth > 0 else 0
    if per == 0:
        return [names] if names else []
    spans, start = [], 0
    for block in range(depth):
        end = matmuls[(block + 1) * per - 1] + 1
        spans.append(names[start:end])
        start = end
    return spans + ([names[start:]] if start < len(names) else [])


def widest_first(model: Any, groups: Sequence[Sequence[str]], peaks: Mapping[str, float] | None) -> list[int]:
    """Indices of ``groups``, the group whose nodes read the largest magnitude first (``peaks``:
    producing node name -> max |output| on the calibration images); graph order without peaks."""
    if not peaks:
        return list(range(len(groups)))
    producer = {out: n.name for n in model.graph.node for out in n.output}
    inputs = {n.name: n.input for n in model.graph.node}

    def score(group: Sequence[str]) -> float:
        return max((peaks.get(producer.get(i, ""), 0.0) for name in group for i in inputs[name]), default=0.0)

    scores = [score(g) for g in groups]
    return sorted(range(len(groups)), key=lambda i: -scores[i])


def ladder(
    model: Any,
    *,
    first: str,
    float_first: Sequence[str],
    groups: Callable[[], Iterable[tuple[str, Sequence[str]]]],
    start: Sequence[str] = (),
    early: Callable[[], Iterable[tuple[str, Sequence[str]]]] | None = None,
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """The steps (name, cumulative keep-float node names): ``start``, then each of ``early()`` (INT8: the
    attention products), then each op type of ``float_first`` present, then each of ``groups()`` (both
    called only when the steps get there)."""

    def named() -> Iterator[tuple[str, Sequence[str]]]:
        yield from early() if early is not None else ()
        for op in float_first:
            yield f"op type {op} float", [n.name for n in model.graph.node if n.op_type == op]
        yield from groups()

    keep = tuple(start)
    yield first, keep
    for name, group in named():
        new = tuple(n for n in group if n not in keep)
        if new:
            keep += new
            yield name, keep


def climb(
    steps: Iterable[tuple[str, tuple[str, ...]]],
    make: Callable[[tuple[str, ...]], Any],
    judge: Callable[[Path], Any],
    dst: Path,
    *,
    label: str,
    unmet: str,
) -> AutopilotResult:
    """Write ``dst`` with ``make(keep_float)`` for each step and ``judge(dst)`` it (a
    :class:`~vitdeploy.export.compare.Comparison`); the first step that passes wins. GateError
    (``unmet`` and the table) when none does, ``dst`` removed."""
    done: list[Step] = []
    for name, keep in steps:
        res = make(keep)
        verdict = judge(dst)
        done.append(Step(name, keep, verdict.passed, dict(verdict.metrics), tuple(verdict.failures)))
        log.info("%s autopilot: %s", label, done[-1].line())
        if verdict.passed:
            return AutopilotResult(res, tuple(done))
    dst.unlink(missing_ok=True)
    table = "; ".join(f"{s.name}: {', '.join(s.failures[:2]) or 'pass'}" for s in done)
    raise GateError(f"{unmet} ({len(done)} steps: {table})", done)


def range_peaks(model: Any, ranges: Path | None) -> dict[str, float]:
    """Max |value| of each calibrated tensor of ``model``, by producing node, from MinMax calibration's
    ranges (``quantize_static``'s cache file ``ranges``; empty when there is none): what
    :func:`widest_first` reads of the quantized nodes' inputs, without running the graph again."""
    if ranges is None or not Path(ranges).is_file():
        return {}
    from onnxruntime.quantization.calibrate import load_tensors_data

    producer = {out: n.name for n in model.graph.node for out in n.output}
    peaks: dict[str, float] = {}
    for name, data in load_tensors_data(ranges).data.items():
        low, high = data.range_value
        node = producer.get(name)
        if node is not None:
            peaks[node] = max(peaks.get(node, 0.0), float(np.max(np.abs(low))), float(np.max(np.abs(high))))
    return peaks


def _block_groups(
    model: Any, spans: list[list[str]], depth: int, peaks: Mapping[str, float] | None, other: str
) -> list[tuple[str, list[str]]]:
    order = widest_first(model, spans, peaks)
    return [(f"block {i} float" if i < depth else other, spans[i]) for i in order if spans[i]]


# --------------------------------------------------------------------------------------------
# INT8 and FP16


def run_fp16_autopilot(
    src: Path,
    dst: Path,
    *,
    judge: Callable[[Path], Any],
    depth: int,
    input_name: str,
    calibration: np.ndarray,
    keep_fp32_ops: Sequence[str],
    max_abs_activation: float,
    external_data_threshold_mb: int = 1536,
) -> AutopilotResult:
    """Convert ``src`` into the FP16 graph ``dst`` with the fewest nodes in float32 that pass ``judge``
    (never fewer than the floor); GateError when none does. ``external_data_threshold_mb``: as convert_fp16's."""
    from .precision import activation_peaks, convert_fp16, hot_nodes

    peaks = activation_peaks(src, calibration, input_name)
    model = _graph(src)
    floor = [n.name for n in model.graph.node if n.op_type in set(keep_fp32_ops)]
    floor += [n for n in hot_nodes(peaks, max_abs_activation) if n not in set(floor)]

    def groups() -> list[tuple[str, list[str]]]:
        return _block_groups(model, block_spans(model, depth), depth, peaks, "other nodes float")

    steps = ladder(model, first="all FP16 but the floor", float_first=FP16_FLOAT_FIRST, groups=groups, start=floor)
    make = lambda keep: convert_fp16(  # noqa: E731
        src,
        dst,
        calibration=calibration,
        input_name=input_name,
        peaks=peaks,  # noqa: E731
        keep_fp32_ops=keep_fp32_ops,
        keep_fp32_nodes=keep,
        max_abs_activation=max_abs_activation,
        external_data_threshold_mb=external_data_threshold_mb,
    )
    return climb(
        steps,
        make,
        judge,
        dst,
        label="fp16",
        unmet="validate-fp16: validation.fp16 not met even with every node in float32",
    )


__all__ = [
    "AutopilotResult",
    "FP16_FLOAT_FIRST",
    "GateError",
    "Step",
    "block_spans",
    "climb",
    "ladder",
    "range_peaks",
    "run_fp16_autopilot",
    "widest_first",
]
