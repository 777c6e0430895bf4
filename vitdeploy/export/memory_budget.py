"""Before a stage that will need more memory than the machine has: say so, instead of being killed.

Each heavy stage's need is a multiple of the model's FP32 weights, measured (``benchmarks/bench_export.py``,
benchmarks/README.md: the peak resident memory of the whole process while the stage ran, on ViT-B/16 and
ViT-L/16, rounded up): what the process already holds (torch and the eager model) is inside the factor.
What the machine can give is what the process holds now plus what the kernel reports available. A
stage that does not fit raises :class:`StageUnavailableError` (exit 4) naming the stage, what it needs,
what is there and the key that switches it off; each row of the stage table then does what it does with
an unavailable stage (the optional INT8 graph goes on without it; a requested one is refused; the
ONNX export itself stops the export, the previous one left in place).
"""

from __future__ import annotations

from typing import Any

from ..base import memory
from ..base.errors import StageUnavailableError

#: stage -> (peak resident memory in FP32 weights, measured and rounded up; the key that switches it off)
NEEDS: dict[str, tuple[float, str]] = {
    "onnx": (6.0, "a machine with more memory: model.onnx is the export"),
    "ort-optimize": (6.5, "export.optimize: false"),
    "fp16": (8.0, "export.fp16.enabled: false"),
    "int8": (10.5, "export.int8.enabled: false"),  # ViT-B/16 9.9x, ViT-L/16 8.2x since weightless pre-processing
    "int8-trt": (10.5, "export.int8.tensorrt: false"),
}


def weight_bytes(model: Any) -> int:
    """The FP32 bytes of ``model``'s parameters and buffers (4 per element, whatever they are stored in)."""
    return 4 * sum(t.numel() for t in (*model.parameters(), *model.buffers()))


def check(stage: str, weights: int) -> None:
    """Raise StageUnavailableError when ``stage`` needs more memory than the machine can give now."""
    if stage not in NEEDS or weights <= 0:
        return
    factor, switch = NEEDS[stage]
    free, held = memory.available_bytes(), memory.rss_bytes()
    if free is None or held is None:  # not Linux: nothing known, nothing refused
        return
    need = factor * weights
    if need > free + held:
        raise StageUnavailableError(
            f"{stage} needs about {memory.human(need)} ({factor:g}x the model's {memory.human(weights)} of FP32 "
            f"weights, measured) and this machine has {memory.human(free + held)} for it "
            f"({memory.human(free)} available, {memory.human(held)} held by the export); set {switch}"
        )


__all__ = ["NEEDS", "check", "weight_bytes"]
