"""Before a stage that will need more memory than the machine has: say so, instead of being killed.

Each heavy stage's need is what the process holds without a model (the libraries and what they keep:
~0.5 GB) plus a multiple of the model's FP32 weights, measured (``benchmarks/bench_export.py`` and
tests/export/test_pipeline_memory.py, benchmarks/README.md: each stage's peak resident memory over that,
rounded up). What the machine can give is what the process holds now plus what the kernel reports
available. A stage that does not fit raises :class:`StageUnavailableError` (exit 4) naming the stage, what it needs,
what is there and the key that switches it off; each row of the stage table then does what it does with
an unavailable stage (the optional INT8 graph goes on without it; a requested one is refused; the
ONNX export itself stops the export, the previous one left in place).
"""

from __future__ import annotations

from typing import Any

from ..base import memory
from ..base.errors import StageUnavailableError

#: stage -> (its peak resident memory over what the process holds without a model, in FP32 weights,
#: measured and rounded up; the key that switches it off). The eager model itself is inside the onnx
#: stage's factor (it is released after the reference stage).
NEEDS: dict[str, tuple[float, str]] = {
    "onnx": (3.5, "a machine with more memory: model.onnx is the export"),  # wide ViT 2.9
    "ort-optimize": (4.0, "export.optimize: false"),  # wide ViT 3.4
    "fp16": (3.5, "export.fp16.enabled: false"),  # wide ViT 2.3
    "int8": (4.5, "export.int8.enabled: false"),  # wide ViT 3.7
    "int8-trt": (4.5, "export.int8.tensorrt: false"),
}


def weight_bytes(model: Any) -> int:
    """The FP32 bytes of ``model``'s parameters and buffers (4 per element, whatever they are stored in)."""
    return 4 * sum(t.numel() for t in (*model.parameters(), *model.buffers()))


def check(stage: str, weights: int, held_without_model: int | None = None) -> None:
    """Raise StageUnavailableError when ``stage`` needs more memory than the machine can give now.

    Its need is what the process holds without a model (``held_without_model``, recorded once the model
    is released; before that, what it holds now less the model's weights) plus its factor of the weights."""
    if stage not in NEEDS or weights <= 0:
        return
    factor, switch = NEEDS[stage]
    free, held = memory.available_bytes(), memory.rss_bytes()
    if free is None or held is None:  # not Linux: nothing known, nothing refused
        return
    base = held_without_model if held_without_model is not None else max(0, held - weights)
    need = base + factor * weights
    if need > free + held:
        raise StageUnavailableError(
            f"{stage} needs about {memory.human(need)} ({memory.human(base)} held without the model + {factor:g}x "
            f"its {memory.human(weights)} of FP32 weights, measured) and this machine has "
            f"{memory.human(free + held)} for it ({memory.human(free)} available, {memory.human(held)} held by the "
            f"export); set {switch}"
        )


#: what the process holds without a model, where it cannot be measured (the libraries: ~0.5 GB, measured)
HELD_WITHOUT_MODEL = 512 * 1024 * 1024


def enabled_stages(cfg: Any) -> tuple[str, ...]:
    """The heavy stages an export with ``cfg`` (PipelineConfig) may run ("auto" counts: it may)."""
    export = cfg.export
    return tuple(
        stage
        for stage, on in (
            ("onnx", True),
            ("ort-optimize", export.optimize),
            ("fp16", export.fp16.enabled),
            ("int8", export.int8.enabled is not False),
            ("int8-trt", export.int8.enabled is not False and export.int8.tensorrt is not False),
        )
        if on
    )


def estimate_peak(cfg: Any, weights: int) -> tuple[int, str, float]:
    """(bytes, stage, factor): the export's estimated peak resident memory, before it runs: what the process
    holds without the model (measured now when it holds the model, else ~0.5 GB) plus the largest factor of
    the FP32 weights among the stages ``cfg`` enables (NEEDS, measured)."""
    held = memory.rss_bytes()
    base = max(HELD_WITHOUT_MODEL, held - weights) if held is not None else HELD_WITHOUT_MODEL
    stage = max(enabled_stages(cfg), key=lambda s: NEEDS[s][0])
    factor = NEEDS[stage][0]
    return int(base + factor * weights), stage, factor


__all__ = ["HELD_WITHOUT_MODEL", "NEEDS", "check", "enabled_stages", "estimate_peak", "weight_bytes"]
