"""Is the INT8 graph worth running? Its speed against the FP32 graph it was quantized from.

A validated INT8 graph that runs no faster than ``model.ort.onnx`` is a file the user carries for
nothing (or worse, one that is slower), so the int8 stage times both on the calibration batch (the
profile's ``opt`` images of it), a few calls each, interleaved so that slow drift of the machine
(frequency, other work) hits both alike, and ships the graph only at ``export.int8.min_speedup``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


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
        return (
            f"{self.speedup:.2f}x {baseline} at batch {self.batch} ({self.int8_s * 1e3:.1f} ms vs "
            f"{self.baseline_s * 1e3:.1f} ms, median of {self.calls} interleaved calls)"
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


def time_against(int8: Any, baseline: Any, batch: np.ndarray, min_speedup: float, calls: int = 3) -> SpeedCheck:
    """Time ``int8`` and ``baseline`` (backends with ``run``) on ``batch``: one warm-up call each, then
    ``calls`` rounds, the order alternating from round to round."""
    int8.run(batch)
    baseline.run(batch)
    times: dict[int, list[float]] = {0: [], 1: []}
    runners = (int8, baseline)
    for i in range(calls):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.perf_counter()
            runners[which].run(batch)
            times[which].append(time.perf_counter() - start)
    return SpeedCheck(statistics.median(times[1]), statistics.median(times[0]), len(batch), calls, min_speedup)


__all__ = ["SpeedCheck", "time_against"]
