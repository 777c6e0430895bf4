"""What the export's stages share: :class:`ExportContext`, one per run, and :class:`StageRecord`, what
a stage reports. The stages (export/stages.py, the table) read and fill the context; the loop
(export/pipeline.py) times them through :meth:`ExportContext.stage`.

The context holds, in the order the stages fill it: the config and the folder written into; the
loaded model, its preprocessing and its name (the ``model`` stage); the validation inputs and the
eager PyTorch reference logits (``reference``); the artifacts validated so far with their manifest
entries, each validation's verdict and the stages' records for the manifest's ``export`` key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np

from ..base import memory
from ..base._files import write_json_atomic
from ..base.config import PipelineConfig
from ..base.vocab import ARTIFACT_FILES, EXPORT_REPORT_NAME
from ..runtime.backends import first_line
from ..runtime.backends.base import BackendOptions
from . import manifest as manifest_mod
from .heartbeat import heartbeat

log = logging.getLogger(__name__)

EngineMode = Literal["auto", "require", "skip"]
CPU = BackendOptions(device="cpu", providers=("CPUExecutionProvider",))  # every ONNX graph is judged here


@dataclass
class StageRecord:
    name: str
    status: str  # "running" | "passed" | "failed" | "skipped"
    seconds: float = 0.0
    reason: str = ""
    outputs: list[Path] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # lines to show a person (the model stage: what was understood)
    peak_rss: int | None = None  # the process's peak resident bytes while the stage ran (base/memory.py)
    progress: str = ""  # how far a running stage is ("32 of 64 inputs run"), shown while it runs, not kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "reason": self.reason,
            "outputs": [p.name for p in self.outputs],
            "peak_rss_bytes": self.peak_rss,
        }


StageCallback = Callable[[StageRecord], None]


@dataclass(frozen=True)
class Refusal:
    """An explicitly requested stage that could not be met: its name, the artifacts it would have
    written (roles) and why (a VitDeployError: its exit code is the export's)."""

    stage: str
    roles: tuple[str, ...]
    error: Any
    hint: str = ""  # the setting that exports without it (the row's refusal_hint)

    @property
    def line(self) -> str:
        """Why, in one line, ending with the key that changes the outcome."""
        return first_line(self.error) + (f"; {self.hint}" if self.hint else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "artifacts": [ARTIFACT_FILES[r] for r in self.roles],
            "error": self.line,
            "exit_code": getattr(self.error, "exit_code", 1),
        }


@dataclass
class ExportContext:
    """One export run's shared state. ``out_dir`` is the staging folder written into while the run
    lasts; ``final_dir`` is where the export lands (named in error messages)."""

    cfg: PipelineConfig
    out_dir: Path
    engine_mode: EngineMode = "auto"
    on_stage: StageCallback | None = None
    validation_batch: tuple[int, ...] | None = None  # batch sizes validated (default: from export.batch.max)
    heartbeat_s: float | None = None
    final_dir: Path | None = None
    # filled by the model stage
    loaded: Any = None  # model.checkpoints.LoadedModel (its eager model released after the reference stage)
    weights: int = 0  # the model's FP32 weight bytes (export/memory_budget.py)
    spec: Any = None  # preprocess_spec.PreprocessSpec
    effective: Any = None  # export.effective.Effective
    name: str = ""
    chw: tuple[int, int, int] = (0, 0, 0)
    image_sizes: tuple[int, ...] = ()  # export.image_sizes of a model that runs at each (chw's side among them)
    output: Any = None  # model.output.ModelOutput: what the exported network returns (logits or an embedding)
    zero_shot: dict[str, Any] | None = None  # the manifest's "zero_shot": what a zero-shot head was baked from
    # filled by the reference stage
    sizes: tuple[int, ...] = ()
    inputs: Any = None  # export.validate.ValidationInputs
    reference: np.ndarray | None = None
    patch_reference: np.ndarray | None = None  # eager's patch tokens (N, P, D), when the export returns them
    #: every other listed size -> (its validation inputs, their eager reference): each artifact judged at each
    other_sizes: dict[int, tuple[Any, np.ndarray]] = field(default_factory=dict)
    # what the stages made: validated artifacts (role -> path), their manifest entries, verdicts, records
    stages: list[StageRecord] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # the manifest's "export" key
    #: explicitly requested stages that could not be met: the export goes on without their artifacts,
    #: records them (manifest "export.refused", export-report.json) and fails at the end
    refused: list[Refusal] = field(default_factory=list)
    #: logits (and patch tokens, or None) a graph gave at the largest validation batch while the autopilot
    #: judged it, keyed by the file's identity (device, inode, size, mtime): its validation reuses them
    judged: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray | None]] = field(default_factory=dict)
    #: one ONNX Runtime backend kept open for the next run of the same file with the same session settings (the
    #: INT8 speed check's graph for its judge, a graph judged and passed for its validation): (file identity,
    #: session config, the backend). Opening a ViT-B/16 graph is a second or more; what is not taken is closed
    #: after the row (:meth:`close_kept`), and keeping another closes it first (one session's memory at most)
    kept: tuple[tuple[int, ...], tuple[tuple[str, str], ...], Any] | None = None
    _trt_reason: Any = field(default=..., init=False, repr=False)  # asked once: tensorrt_unavailable()

    def __post_init__(self) -> None:
        self.final_dir = self.final_dir or self.out_dir

    @property
    def kind(self) -> str:
        """The output's kind (vocab.OUTPUT_KINDS): how every artifact is judged."""
        return self.output.kind if self.output is not None else "logits"

    def release_model(self) -> None:
        """Drop the eager model once nothing after needs it (the reference logits exist): every later
        stage works on ONNX graphs, and the weights would otherwise count against each one's memory."""
        if self.loaded is None or self.loaded.model is None:
            return
        self.loaded = dataclasses.replace(self.loaded, model=None)
        if self.effective is not None:
            self.effective = dataclasses.replace(self.effective, loaded=self.loaded)
        gc.collect()
        memory.give_back()
        held = memory.rss_bytes()
        # what the process holds with no model (the libraries and what they keep): each later stage's
        # peak is this plus what its work on the weights costs (the export's memory is read against it)
        self.extra["memory"] = {"weights_bytes": self.weights, **({"held_without_model_bytes": held} if held else {})}

    # -- artifacts ----------------------------------------------------------------------------
    def path(self, role: str) -> Path:
        """Where the artifact ``role`` is written (vocab.ARTIFACT_FILES)."""
        return self.out_dir / ARTIFACT_FILES[role]

    def add(self, role: str, path: Path, external: list[Path] | tuple[Path, ...] = ()) -> None:
        """Record a validated artifact: in the result and, with its sha256, in the manifest."""
        self.artifacts[role] = path
        self.entries[role] = manifest_mod.file_entry(path, self.out_dir, external)

    def role_of(self, path: Path) -> str:
        return next(role for role, p in self.artifacts.items() if p == path)

    def drop(self, roles: tuple[str, ...], rejected: bool = False) -> None:
        """Remove what was written for ``roles`` (with external data; with ``rejected`` the
        ``*.rejected`` copies too): an artifact the export goes on without."""
        for role in roles:
            path = self.path(role)
            for p in (path, path.with_name(path.name + ".data")):
                for q in (p, p.with_name(p.name + ".rejected")) if rejected else (p,):
                    q.unlink(missing_ok=True)

    def refuse(self, stage: str, roles: tuple[str, ...], exc: Any, hint: str = "") -> None:
        """Record that the requested stage ``stage`` could not be met; its artifacts are removed (a
        ``*.rejected`` copy of one that drifted stays, for inspection) and the export goes on."""
        self.drop(roles)
        self.refused.append(Refusal(stage, roles, exc, hint))
        self.extra["refused"] = self.refusals()

    @staticmethod
    def file_identity(path: Path) -> tuple[int, ...]:
        st = path.stat()
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def close_kept(self) -> None:
        """Close the backend kept open, if any (the loop does after every row)."""
        kept, self.kept = self.kept, None
        if kept is not None:
            kept[2].close()

    def refusals(self) -> list[dict[str, Any]]:
        """What was refused, as the manifest and export-report.json record it."""
        return [r.to_dict() for r in self.refused]

    # -- TensorRT -----------------------------------------------------------------------------
    def tensorrt_device(self) -> str:
        device = self.cfg.runtime.device
        return device if device.startswith("cuda") else "cuda:0"  # build where it will run

    def tensorrt_unavailable(self) -> str | None:
        """Why no TensorRT engine can be built in this export (None when one can); asked once."""
        if self._trt_reason is ...:
            if self.engine_mode == "skip":
                self._trt_reason = "--engine skip"
            else:
                from . import tensorrt as trt_stage

                self._trt_reason = trt_stage.tensorrt_unavailable_reason(self.tensorrt_device())
        return self._trt_reason

    # -- stage records ------------------------------------------------------------------------
    def emit(self, rec: StageRecord) -> None:
        if self.on_stage:
            self.on_stage(rec)

    def skip(self, name: str, reason: str) -> None:
        rec = StageRecord(name, "skipped", reason=reason)
        self.stages.append(rec)
        self.emit(rec)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[StageRecord]:
        """Time a stage, report it running (again every ``heartbeat_s`` seconds, with the time
        elapsed) and then passed or failed; a failure writes the report."""
        rec = StageRecord(name, "running")
        self.stages.append(rec)
        self.emit(rec)
        memory.give_back()  # what earlier stages freed is not counted against this one
        measured = memory.reset_peak()  # the peak from here is this stage's
        start = time.perf_counter()

        def beat() -> None:  # "running" again, with the seconds elapsed so far
            rec.seconds = time.perf_counter() - start
            self.emit(rec)

        try:
            with heartbeat(beat, self.heartbeat_s if self.on_stage else None):
                yield rec
        except BaseException as exc:
            rec.peak_rss = memory.peak_rss_bytes() if measured else None
            rec.seconds, rec.status = time.perf_counter() - start, "failed"
            rec.reason = rec.reason or first_line(exc)
            self.emit(rec)
            self.write_report()
            raise
        rec.seconds = time.perf_counter() - start
        rec.peak_rss = memory.peak_rss_bytes() if measured else None
        rec.status = "passed" if rec.status == "running" else rec.status  # a stage may mark itself skipped
        self.emit(rec)

    def write_report(self) -> None:
        """``export-report.json``: every stage so far, every verdict and every refusal (written when a stage
        fails, and at the end of an export that refused a requested stage)."""
        try:
            report = {
                "passed": False,
                "stages": [s.to_dict() for s in self.stages],
                "validation": self.validation,
                "refused": self.refusals(),
                **({"memory": self.extra["memory"]} if "memory" in self.extra else {}),
            }
            write_json_atomic(self.out_dir / EXPORT_REPORT_NAME, report)
        except OSError:  # pragma: no cover - reporting must never mask the real error
            log.exception("could not write %s", self.out_dir / EXPORT_REPORT_NAME)


def open_ort(ctx: Any, path: Path, name: str, session_config: tuple[tuple[str, str], ...] = ()) -> Any:
    """An OrtBackend on the CPU (where every graph is judged) for ``path``, with ``session_config``: the one ``ctx``
    kept open for this very file and these settings (:meth:`ExportContext.keep_ort`) when there is one, else a new
    one (a context that keeps none, ``kept`` absent, always gets a new one)."""
    kept = getattr(ctx, "kept", None)
    if kept is not None:
        ctx.kept = None
        if kept[:2] == (ExportContext.file_identity(path), tuple(session_config)):
            kept[2].name = name
            return kept[2]
        kept[2].close()
    from ..runtime.backends.ort import OrtBackend

    return OrtBackend(path, ctx.chw, None, CPU, name=name, session_config=session_config)


def keep_ort(ctx: Any, path: Path, backend: Any) -> None:
    """Keep ``backend`` (an OrtBackend of ``path``) open in ``ctx`` for the next :func:`open_ort` of the same file
    with the same settings, closing one kept before; closed at once where ``ctx`` keeps none."""
    if not isinstance(ctx, ExportContext):
        backend.close()
        return
    ctx.close_kept()
    ctx.kept = (ctx.file_identity(path), tuple(backend.session_config), backend)
