"""The INT8 autopilot: the speed budget first, then the fewest nodes in float that pass the gate.

Its steps are export/autopilot.py's ladder (everything quantized; then, where the graph quantized has
its attention products quantized (export/int8_attention.py), every one of them back in float: "attention
float"; then the op types of the placement's ``float_first``; then one block at a time, widest first),
each cumulative. What it spends on them:

1. the fully quantized graph is the one graph quantized (``quantize_static``, calibrated once); with a
   speed guard (export/int8_speed.py) it is timed before anything else, and does not go further when it
   does not pay. It is judged first: a model whose INT8 passes as it is costs one judgement;
2. when it misses the gate, the budget: from its measured speed, the steps that can still pay (fewer INT8
   multiply-adds only make a graph slower, so they are the ladder's first ones). The largest of them (the
   most nodes in float the speed allows) is looked at next, on the inputs the fully quantized graph failed
   on, alone: when they prove that even it misses the gate, no step that pays can pass (a step with fewer
   nodes in float would not pass where more did not), and the stage stops there, after one judgement and
   a few inputs (export/precision_stages.py ``_Judge``);
3. otherwise the steps inside the budget, from the fewest nodes in float up: the first that passes ships,
   and the largest, judged on every input last, when none before it does (without that first look, the
   largest is judged on every input first, and the stage stops when it fails).

Every step after the first is derived from the fully quantized graph (export/dequantize.py: the same file
``quantize_static`` would write with those nodes excluded), not quantized again. Each step's graph lies
in a folder of its own named as the graph that ships, so the one that passes is moved into place with the
judgement its validation reuses (export/precision_stages.py keys it by the file itself).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .autopilot import AutopilotResult, GateError, Step, _block_groups, _graph, block_spans, ladder, range_peaks
from .int8_readback import read_quantized_nodes
from .quantize import ORT_CPU, Int8Result, Placement, quantize_prepared

log = logging.getLogger(__name__)

#: the step that returns every attention product (Q·Kᵀ, weights·V) to float: the first after the fully
#: quantized graph, where that graph has them quantized
ATTENTION_FLOAT = "attention float"


class _Graphs:
    """The autopilot's graphs, each in its own folder under ``work``: the fully quantized one, quantized
    from ``pre``; every other derived from it (quantized again where export/dequantize.py cannot)."""

    def __init__(self, pre: Path, dst: Path, work: Path, placement: Placement, quantize: dict[str, Any]) -> None:
        self.pre, self.dst, self.work, self.placement, self.quantize = pre, dst, work, placement, quantize
        self.full: Int8Result | None = None

    def _slot(self, name: str) -> Path:
        folder = self.work / name
        folder.mkdir(exist_ok=True)
        return folder / self.dst.name

    def quantized(self) -> Int8Result:
        """The fully quantized graph (every node of the placement's op types but the shape-only ones)."""
        self.full = quantize_prepared(self.pre, self._slot("full"), placement=self.placement, **self.quantize)
        return self.full

    def step(self, keep: Sequence[str], slot: str) -> Int8Result:
        """The fully quantized graph with ``keep`` returned to float, written into ``slot``."""
        from .dequantize import dequantize

        full, path = self.full, self._slot(slot)
        assert full is not None
        external = bool(self.quantize.get("external_data"))
        args = dict(keep_float=keep, before=full.keep_float, op_types=self.placement.op_types, external_data=external)
        if not dequantize(full.path, self.pre, path, **args):
            log.info("int8 autopilot: %d node(s) in float quantized again (not derivable here)", len(keep))
            return quantize_prepared(self.pre, path, keep_float=keep, placement=self.placement, **self.quantize)
        data = path.with_name(path.name + ".data")
        quantized, kept = read_quantized_nodes(path, self.pre, self.placement.op_types, (*keep, *full.keep_float))
        return dataclasses.replace(
            full,
            path=path,
            quantized_nodes=quantized,
            keep_float=kept,
            attention=tuple(n for n in full.attention if n in set(quantized)),
            external_data=(data,) if external and data.is_file() else (),
        )

    def attention(self) -> list[tuple[str, tuple[str, ...]]]:
        """The ladder's first step after the fully quantized graph: its attention products quantized (none
        where attention was not written out, or not quantized: a dynamic graph, TensorRT's placement)."""
        full = self.full
        return [(ATTENTION_FLOAT, full.attention)] if full is not None and full.attention else []

    def ship(self, res: Int8Result) -> Int8Result:
        """``res`` moved to ``dst`` (its external data first, the graph last): the file judged, unchanged."""
        moved = []
        for extra in res.external_data:
            os.replace(extra, self.dst.with_name(extra.name))
            moved.append(self.dst.with_name(extra.name))
        os.replace(res.path, self.dst)
        return dataclasses.replace(res, path=self.dst, external_data=tuple(moved))


def _budget(steps: Sequence[tuple[str, tuple[str, ...]]], speed: Any) -> int:
    """How many of ``steps`` (after the fully quantized graph) can still pay (all of them without a guard)."""
    if speed is None:
        return len(steps)
    return next((i for i, (name, keep) in enumerate(steps) if not speed.can_pay(name, keep)), len(steps))


def search_budget(
    first: str,
    rest: Callable[[], list[tuple[str, tuple[str, ...]]]],
    graphs: _Graphs,
    judge: Callable[[Path], Any],
    *,
    unmet: str,
    speed: Any = None,
    quick: Callable[[Path], Any] | None = None,
) -> AutopilotResult:
    """The search of the module docstring: ``first`` names the fully quantized graph, ``rest()`` lists the
    later steps (name, cumulative keep-float list). ``quick(path)``: the inputs the last failing step failed
    on, alone: a failing verdict when they prove the gate missed, else None (then ``judge`` decides, after
    the steps below). GateError (the steps judged) when no step passes and pays."""
    done: list[Step] = []

    def record(name: str, keep: tuple[str, ...], verdict: Any) -> bool:
        done.append(Step(name, keep, verdict.passed, dict(verdict.metrics), tuple(verdict.failures)))
        log.info("int8 autopilot: %s", done[-1].line())
        return bool(verdict.passed)

    full = graphs.quantized()
    if speed is not None:
        speed.check_full(full.path)  # speed first: raises when it does not pay
    if record(first, (), judge(full.path)):
        return AutopilotResult(graphs.ship(full), tuple(done))
    steps = rest()
    budget = _budget(steps, speed)
    if budget:
        name, keep = steps[budget - 1]
        largest = graphs.step(keep, "largest")
        verdict = quick(largest.path) if quick is not None else judge(largest.path)
        if verdict is None or record(name, keep, verdict):
            for lower, float_now in steps[: budget - 1]:
                res = graphs.step(float_now, "step")
                if record(lower, float_now, judge(res.path)):
                    return AutopilotResult(graphs.ship(res), tuple(done))
            if verdict is not None or record(name, keep, judge(largest.path)):
                return AutopilotResult(graphs.ship(largest), tuple(done))
    if budget < len(steps):
        raise GateError(
            f"{unmet.split(':')[0]}: validation.int8 and export.int8.min_speedup cannot both be met: "
            f"{done[-1].name} missed validation.int8 ({', '.join(done[-1].failures[:2])}) and {speed.stopped}",
            done,
        )
    table = "; ".join(f"{s.name}: {', '.join(s.failures[:2]) or 'pass'}" for s in done)
    raise GateError(f"{unmet} ({len(done)} steps judged: {table})", done)


def run_autopilot(
    pre: Path,
    dst: Path,
    *,
    judge: Callable[[Path], Any],
    depth: int,
    input_name: str,
    calibration: np.ndarray | None,
    placement: Placement = ORT_CPU,
    stage: str = "validate-int8",
    speed: Any = None,
    quick: Callable[[Path], Any] | None = None,
    **quantize: Any,
) -> AutopilotResult:
    """Quantize ``pre`` into ``dst`` with the fewest nodes in float that pass ``judge`` within the speed
    ``speed`` allows (the module docstring; ``quick``: see :func:`search_budget`); GateError when none does,
    ``dst`` not written."""
    from .precision import activation_peaks

    model, ops = _graph(pre), placement.op_types
    kind = {n.name: n.op_type for n in model.graph.node}

    def groups() -> list[tuple[str, list[str]]]:
        spans = [[n for n in span if kind[n] in ops] for span in block_spans(model, depth)]
        peaks = None
        if calibration is not None and len(spans) > 1:  # the calibrated ranges say it when they are MinMax's
            ranges = quantize.get("ranges") if quantize.get("method", "minmax") == "minmax" else None
            peaks = range_peaks(model, ranges) or activation_peaks(pre, calibration, input_name)
        return _block_groups(model, spans, depth, peaks, f"other {'/'.join(ops)} float")

    names = "/".join(ops)
    args = dict(input_name=input_name, calibration=calibration, **quantize)
    with tempfile.TemporaryDirectory(prefix=".int8-steps-", dir=dst.parent) as work:
        graphs = _Graphs(pre, dst, Path(work), placement, args)
        order = dict(float_first=placement.float_first, groups=groups, early=graphs.attention)
        steps = ladder(model, first=f"all {names} quantized", **order)
        first, _ = next(steps)
        unmet = f"{stage}: validation.int8 not met even with every {names} in float"
        return search_budget(first, lambda: list(steps), graphs, judge, unmet=unmet, speed=speed, quick=quick)


__all__ = ["ATTENTION_FLOAT", "run_autopilot", "search_budget"]
