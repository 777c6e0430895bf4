"""What a row of the export's stage table is (the table itself: ``STAGES`` in export/pipeline.py).

A :class:`Stage` says only what is particular to one stage: its name, why it would be skipped, what
it runs (returning the :class:`Artifact` s it wrote), which ``validation.*`` gate its artifact must
meet (:class:`Gate`) and what the export does when it fails. Everything else is the loop's, once
for every row: the timing, the progress lines, running the validation, the manifest entries, the
``*.rejected`` renames and the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .context import ExportContext, StageRecord, open_ort


@dataclass(frozen=True)
class Artifact:
    """One file a stage wrote (``role``: its key in vocab.ARTIFACT_FILES and in the manifest)."""

    role: str
    path: Path
    external: tuple[Path, ...] = ()  # ONNX external data beside the graph

    @property
    def files(self) -> list[Path]:
        return [self.path, *self.external]


Made = tuple[Artifact, ...]


@dataclass(frozen=True)
class Gate:
    """How a row's artifacts are validated: the stage ``name`` (``validate-...``) runs them through
    the backend ``open`` returns against the eager PyTorch reference, within ``validation.<tolerance>``."""

    name: str
    tolerance: str  # "fp32" | "fp16" | "int8": the validation section's key
    open: Callable[[ExportContext, Made], Any]  # the runtime backend that will run the artifact
    sizes: Callable[[ExportContext], tuple[int, ...]] | None = None  # batch sizes (default: the context's)
    #: a verdict only: a miss is recorded (the stage fails, this line says what follows) and the export goes on
    #: with its artifact, nothing rejected (validate-bf16: model.onnx at another precision, not a file of its own)
    advisory: str = ""


def _never(ctx: ExportContext) -> None:
    return None


def _always(ctx: ExportContext) -> bool:
    return True


def _no(ctx: ExportContext) -> bool:
    return False


@dataclass(frozen=True)
class Stage:
    """One row of the export: ``run`` writes into ``ctx.out_dir`` and returns what it wrote (the
    loop validates it with ``gate`` and adds it to the manifest); it may mark its record skipped
    (then nothing is validated or added) and set the record's reason and outputs."""

    name: str
    run: Callable[[ExportContext, StageRecord], Made]
    skip: Callable[[ExportContext], str | None] = _never  # why the stage is skipped (None: it runs)
    gate: Gate | None = None
    roles: tuple[str, ...] = ()  # the artifacts it writes: removed when it is skipped or dropped
    applies: Callable[[ExportContext], bool] = _always  # False: not even a skipped record (nothing to do)
    #: after validation, whether the artifact ships (False: removed, not in the manifest); may run a stage
    ships: Callable[[ExportContext, Made], bool] | None = None
    #: errors the export goes on after, without the row's artifacts: silently but for ``dropped`` (a
    #: warning, from the row's module), or, when the row is ``required`` (asked for explicitly), as a
    #: refusal: recorded in the manifest and export-report.json, and the export exits non-zero at the end
    fallible: tuple[type[BaseException], ...] = ()
    required: Callable[[ExportContext], bool] = _no
    dropped: Callable[[ExportContext, BaseException], None] | None = None
    #: errors that are a refusal however the row was asked for (an FP16 artifact that misses its gate)
    refused_on: tuple[type[BaseException], ...] = ()
    #: what a refusal's line ends with: the setting that exports without the artifact
    refusal_hint: str = ""


def ort_gate(name: str, tolerance: str, backend: str, session_config: tuple[tuple[str, str], ...] = ()) -> Gate:
    """A graph judged by ONNX Runtime on the CPU (``backend``: how the run is named in reports), with the
    session settings the backend that runs it uses (``session_config``: model.int8.onnx's)."""

    def open_graph(ctx: ExportContext, made: Made) -> Any:  # the session its judge kept open, when there is one
        return open_ort(ctx, made[0].path, backend, session_config)

    return Gate(name, tolerance, open_graph)
