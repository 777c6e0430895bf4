"""The export's ``bf16`` row: model.onnx run at BF16 by OpenVINO (``openvino-bf16``), judged against eager
PyTorch by ``validation.bf16``. A row of the table in export/pipeline.py.

It writes no file: BF16 is a precision OpenVINO runs model.onnx at, on a CPU with BF16 math (AVX512-BF16 or
AMX). Its gate is a verdict only (``validate-bf16`` in the manifest): a miss fails that stage and the export
goes on with everything else; ``auto`` then never picks openvino-bf16 for this export. Skipped, with the reason,
where OpenVINO is not installed or the CPU has no BF16 math: the manifest then has no verdict, and auto does
not pick openvino-bf16 either (a verdict taken here says nothing about another export).
"""

from __future__ import annotations

from typing import Any

from ..base.errors import BackendError, MissingDependencyError
from ..base.vocab import OPENVINO_BF16, VALIDATE_BF16
from .context import CPU, ExportContext, StageRecord
from .rows import Artifact, Gate, Made, Stage


def _skip(ctx: ExportContext) -> str | None:
    from ..runtime.backends import backend_unavailable_reason

    reason = backend_unavailable_reason(OPENVINO_BF16)  # openvino installed, the CPU's BF16 math
    return f"{OPENVINO_BF16} cannot run here: {reason}" if reason else None


def _graph(ctx: ExportContext, rec: StageRecord) -> Made:
    """model.onnx as written (already in the manifest): what the gate runs at BF16."""
    rec.reason = f"{ctx.path('onnx').name} at BF16 in OpenVINO"
    return (Artifact("onnx", ctx.artifacts["onnx"]),)


def _open(ctx: ExportContext, made: Made) -> Any:
    from ..runtime.backends.openvino import OpenVinoBackend

    return OpenVinoBackend(made[0].path, ctx.chw, None, CPU, name=OPENVINO_BF16, precision="bf16")


def _never_ships(ctx: ExportContext, made: Made) -> bool:
    return False  # model.onnx is in the manifest already; this row adds a verdict, not a file


BF16 = Stage(
    "bf16",
    _graph,
    skip=_skip,
    gate=Gate(
        VALIDATE_BF16,
        "bf16",
        _open,
        advisory=f"{OPENVINO_BF16} misses validation.bf16: auto never picks it for this export (the export goes on)",
    ),
    ships=_never_ships,
    fallible=(BackendError, MissingDependencyError),
)
