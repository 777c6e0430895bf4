"""`vitdeploy export`: the stages composed. Each stage is a small function with plain inputs and
outputs (see the sibling modules); this module runs the ones the config asks for, times them,
reports them through a callback and writes the manifest last.

A manifest is the only mark of a valid export: it is written only when every stage that ran has
passed. Every stage writes into a staging folder beside the output folder, swapped in when the
export succeeds (export/staging.py), so the output folder always holds one complete export, the
previous or the new one, even after ``kill -9``. An artifact that fails validation is renamed
``<name>.rejected`` so nothing loads it as valid; its report is ``export-report.json`` (both are
moved into the output folder, beside the previous export).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np

from .._files import write_json_atomic
from .._heartbeat import heartbeat
from ..config import PipelineConfig
from ..errors import ExportError, MissingDependencyError, ValidationError
from ..demo import IMAGES_DIR as DEMO_IMAGES_DIR
from ..runtime.artifacts import MANIFEST_NAME
from ..runtime.backends.base import BackendOptions
from ..vocab import ARTIFACT_FILES
from . import manifest as manifest_mod
from .engine_stages import EngineStages
from .precision_stages import PrecisionStages
from .effective import describe, load_model, resolve_preprocess  # noqa: F401 - load_model/resolve_preprocess: public here too
from .onnx import INPUT_NAME, OUTPUT_NAME, export_onnx
from .validate import ValidationInputs, build_inputs, validate_artifact, validation_batch_sizes

log = logging.getLogger(__name__)

EngineMode = Literal["auto", "require", "skip"]
REPORT_NAME = "export-report.json"
FILES = ARTIFACT_FILES
_OUR_NAMES = {*FILES.values(), MANIFEST_NAME, REPORT_NAME, "timing.cache", *(f"{n}.data" for n in FILES.values())}


@dataclass
class StageRecord:
    name: str
    status: str  # "passed" | "failed" | "skipped"
    seconds: float = 0.0
    reason: str = ""
    outputs: list[Path] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # lines to show a person (the model stage: what was understood)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3), "reason": self.reason,
                "outputs": [p.name for p in self.outputs]}


@dataclass
class ExportResult:
    out_dir: Path
    stages: list[StageRecord]
    artifacts: dict[str, Path]
    validation: dict[str, Any]
    manifest_path: Path | None


StageCallback = Callable[[StageRecord], None]


def validation_images(cfg: PipelineConfig) -> list[Path]:
    from ..runtime.image_paths import iter_image_paths

    folder = cfg.resolve(cfg.validation.images) or (DEMO_IMAGES_DIR if DEMO_IMAGES_DIR.is_dir() else None)
    if folder is None:
        return []
    return iter_image_paths([folder])[: cfg.validation.max_images]


def reference_logits(model: Any, batch: np.ndarray, chunk: int = 16) -> np.ndarray:
    import torch

    with torch.inference_mode():
        outs = [model(torch.from_numpy(batch[i : i + chunk])).float().numpy() for i in range(0, len(batch), chunk)]
    return np.concatenate(outs)


def _prepare_out_dir(out_dir: Path) -> Path:
    """The folder to export into (symlinks resolved), created, writable, stale temporaries gone."""
    from .staging import clean_stale

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create output directory {out_dir}: {exc.strerror}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ExportError(f"output directory {out_dir} is not writable")
    final = out_dir.resolve()
    clean_stale(final, _OUR_NAMES)
    return final


def _reject(paths: list[Path]) -> None:
    for path in paths:
        if path.exists():
            os.replace(path, path.with_name(path.name + ".rejected"))


class _Export(PrecisionStages, EngineStages):
    """One export run: the stages in order, each timed and reported, the manifest last (the reduced-precision
    graphs: export/precision_stages.py; the TensorRT engines: export/engine_stages.py)."""

    def __init__(self, cfg: PipelineConfig, out_dir: Path, engine: EngineMode, on_stage: StageCallback | None,
                 validation_batch: tuple[int, ...] | None, heartbeat_s: float | None = None) -> None:
        self.cfg, self.out_dir, self.engine_mode, self.on_stage = cfg, out_dir, engine, on_stage
        self.heartbeat_s = heartbeat_s
        self.validation_batch = validation_batch
        self.final_dir = out_dir  # where the export lands; out_dir is the staging folder while it runs
        self.stages: list[StageRecord] = []
        self.artifacts: dict[str, Path] = {}
        self.entries: dict[str, dict[str, Any]] = {}
        self.validation: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}

    # -- bookkeeping --------------------------------------------------------------------------
    def _emit(self, rec: StageRecord) -> None:
        if self.on_stage:
            self.on_stage(rec)

    def skip(self, name: str, reason: str) -> None:
        rec = StageRecord(name, "skipped", reason=reason)
        self.stages.append(rec)
        self._emit(rec)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[StageRecord]:
        """Time a stage, report it running (again every ``heartbeat_s`` seconds, with the time
        elapsed) and then passed or failed; a failure writes the report."""
        rec = StageRecord(name, "running")
        self.stages.append(rec)
        self._emit(rec)
        start = time.perf_counter()

        def beat() -> None:  # "running" again, with the seconds elapsed so far
            rec.seconds = time.perf_counter() - start
            self._emit(rec)

        try:
            with heartbeat(beat, self.heartbeat_s if self.on_stage else None):
                yield rec
        except BaseException as exc:
            rec.seconds, rec.status = time.perf_counter() - start, "failed"
            rec.reason = rec.reason or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self._emit(rec)
            _write_report(self.out_dir, self.stages, self.validation)
            raise
        rec.seconds = time.perf_counter() - start
        rec.status = "passed" if rec.status == "running" else rec.status  # a stage may mark itself skipped
        self._emit(rec)

    def add(self, role: str, path: Path, external: list[Path] | tuple[Path, ...] = ()) -> None:
        self.artifacts[role] = path
        self.entries[role] = manifest_mod.file_entry(path, self.out_dir, external)

    # -- stages -------------------------------------------------------------------------------
    def run(self) -> ExportResult:
        cfg, out = self.cfg, self.out_dir
        with self.stage("model") as rec:  # 1
            from ..model.checkpoints import save_checkpoint

            from .effective import Effective

            self.loaded = load_model(cfg)
            self.spec, origins = resolve_preprocess(cfg, self.loaded)
            self.effective = Effective(self.loaded, self.spec, origins)
            rec.details = describe(self.effective, cfg)
            self.name = cfg.model.name or self.loaded.name
            save_checkpoint(out, self.loaded.model, self.loaded.labels, self.spec, self.name)
            rec.outputs = [out / FILES["weights"], out / FILES["weights-config"]]
        vit = self.loaded.config
        self.chw = (vit.in_channels, vit.image_size, vit.image_size)

        with self.stage("onnx") as rec:  # 2
            metadata = {"vitdeploy.name": self.name, "vitdeploy.labels": list(self.loaded.labels),
                        "vitdeploy.preprocess": self.spec.to_dict(), "vitdeploy.vit": vit.to_dict()}
            onnx_art = export_onnx(self.loaded.model, out / FILES["onnx"], image_size=vit.image_size,
                                   in_channels=vit.in_channels, opset=cfg.export.opset, metadata=metadata,
                                   external_data_threshold_mb=cfg.export.external_data_threshold_mb)
            rec.outputs = [onnx_art.path, *onnx_art.external_data]

        with self.stage("reference") as rec:  # eager PyTorch on the validation inputs, once for every check
            self._prepare_validation()
            n, n_images = len(self.inputs.names), self.inputs.image_count
            rec.reason = f"eager PyTorch logits for {n} inputs ({n_images} images, {n - n_images} noise)"
        from ..runtime.backends.ort import OrtBackend

        cpu = BackendOptions(device="cpu", providers=("CPUExecutionProvider",))
        onnx_path = out / FILES["onnx"]
        self.validate("validate-onnx", lambda: OrtBackend(onnx_path, self.chw, None, cpu, name="ort"),
                      cfg.validation.fp32, [onnx_path, *onnx_art.external_data])  # 3
        self.add("onnx", onnx_path, onnx_art.external_data)
        self._ort_graph(vit, cpu)  # 3b

        if cfg.export.fp16.enabled:  # 4-5
            self._fp16(cpu, vit, onnx_path)
        else:
            (out / FILES["onnx-fp16"]).unlink(missing_ok=True)
            self.skip("fp16", "export.fp16.enabled is false")

        self._int8(cpu, vit)  # 5b
        self._int8_tensorrt(cpu, vit)  # 5c
        self._engine()  # 6-7
        return self._manifest()  # 8

    def _ort_graph(self, vit: Any, cpu: BackendOptions) -> None:
        """model.ort.onnx: the ONNX Runtime-only FP32 graph (contrib ops, never fed to TensorRT).

        Optional: when the optimiser is missing or fails, the stage is skipped and "ort" runs
        model.onnx; when the graph drifts it is rejected like any other artifact (exit 3)."""
        from ..runtime.backends.ort import OrtBackend
        from .optimize import fused_op_counts, optimize_for_ort

        cfg, out = self.cfg, self.out_dir
        path = out / FILES["onnx-ort"]
        data = path.with_name(path.name + ".data")
        if not cfg.export.optimize:
            path.unlink(missing_ok=True)
            data.unlink(missing_ok=True)
            return self.skip("ort-optimize", "export.optimize is false")
        with self.stage("ort-optimize") as rec:
            try:
                # the class-token-only last block is sound only when the classifier reads the class token alone;
                # MultiHeadAttention takes projected q/k/v, with no place for qk-norm's LayerNorms between
                if vit.qk_norm:
                    log.info("attention fusion skipped: qk-norm normalises q and k between the projection and the "
                             "attention, which the fused MultiHeadAttention op cannot express")
                optimize_for_ort(out / FILES["onnx"], path, num_heads=vit.heads, hidden_size=vit.width,
                                 external_data_threshold_mb=cfg.export.external_data_threshold_mb,
                                 attention="none" if vit.qk_norm else "MultiHeadAttention",
                                 class_token_only=vit.reads_class_token_only)
            except (ExportError, MissingDependencyError) as exc:
                # Said once, on the stage's line (not also as a warning).
                path.unlink(missing_ok=True)
                data.unlink(missing_ok=True)
                rec.status = "skipped"
                rec.reason = f"model.ort.onnx not written, the ort backend will run model.onnx: {str(exc).splitlines()[0]}"
                return
            fused = fused_op_counts(path)
            self.extra["ort_optimize"] = {"fused": fused}
            rec.reason = ", ".join(f"{n} {op}" for op, n in fused.items())
            rec.outputs = [path, *([data] if data.is_file() else [])]
        external = [data] if data.is_file() else []
        self.validate("validate-ort-optimized", lambda: OrtBackend(path, self.chw, None, cpu, name="ort"),
                      cfg.validation.fp32, [path, *external])
        self.add("onnx-ort", path, external)

    def _role_of(self, path: Path) -> str:
        return next(role for role, p in self.artifacts.items() if p == path)

    def _prepare_validation(self) -> None:
        from ..runtime.preprocess import Preprocessor

        cfg = self.cfg
        self.sizes = self.validation_batch or validation_batch_sizes(cfg.export.batch.max)
        self.inputs: ValidationInputs = build_inputs(
            Preprocessor(self.spec), validation_images(cfg), noise_samples=cfg.validation.noise_samples,
            seed=cfg.validation.seed, min_count=max(self.sizes))
        self.reference = reference_logits(self.loaded.model, self.inputs.batch)

    def validate(self, stage: str, open_backend: Callable[[], Any], tolerance: Any, files: list[Path],
                 sizes: tuple[int, ...] | None = None) -> None:
        """Run the artifact through its runtime backend; on drift, reject it and raise (exit 3)."""
        sizes = sizes or self.sizes
        with self.stage(stage) as rec:
            backend = open_backend()
            try:
                result = validate_artifact(stage, backend, self.inputs, self.reference, tolerance.model_dump(), sizes)
            finally:
                backend.close()
            self.validation[stage] = result.to_dict()
            if not result.passed:
                _reject(files)
                rec.reason = "; ".join(result.failures[:6])
                raise ValidationError(
                    f"{stage}: {result.backend} output drifted beyond validation thresholds: {rec.reason} "
                    f"(artifact renamed *.rejected; full report: {self.final_dir / REPORT_NAME})")
            rec.reason = (f"{len(self.inputs.names)} inputs at batch {', '.join(map(str, sizes))}; "
                          f"worst max|diff| {result.worst_metrics()['max_abs_diff']:.3g}")

    def _manifest(self) -> ExportResult:
        cfg, out = self.cfg, self.out_dir
        with self.stage("manifest") as rec:
            for role in ("weights", "weights-config"):
                self.add(role, out / FILES[role])
            names = self.inputs.names
            manifest = manifest_mod.build_manifest(
                name=self.name, vit=self.loaded.config.to_dict(),
                source=self.effective.model_record(cfg),
                labels=self.loaded.labels, preprocess=self.spec.to_dict(), input_name=INPUT_NAME,
                output_name=OUTPUT_NAME, chw=self.chw, batch=cfg.export.batch.model_dump(), artifacts=self.entries,
                validation=self.validation, stages=[s.to_dict() for s in self.stages if s.name != "manifest"],
                extra={"preprocess_origins": self.effective.origins, "export": self.extra, "validation_inputs": {
                    "count": len(names), "images": self.inputs.image_count,
                    "batch_sizes": list(self.sizes)}},
            )
            path = manifest_mod.write_manifest(out, manifest)
            (out / REPORT_NAME).unlink(missing_ok=True)
            rec.outputs = [path]
        return ExportResult(out, self.stages, self.artifacts, self.validation, path)


def run_export(
    cfg: PipelineConfig,
    out_dir: Path | None = None,
    *,
    engine: EngineMode = "auto",
    on_stage: StageCallback | None = None,
    validation_batch: tuple[int, ...] | None = None,
    heartbeat_s: float | None = 1.0,
) -> ExportResult:
    """Run every stage the config asks for into ``out_dir`` (default ``export.output_dir``).

    ``on_stage`` is called when a stage starts (status "running", ``seconds`` 0), again every
    ``heartbeat_s`` seconds while it runs (status "running", ``seconds`` elapsed so far; from a
    background thread; None = never) and when it ends. Raises
    ValidationError (exit 3) after writing ``export-report.json`` if an artifact drifts,
    MissingDependencyError (exit 4) for ``engine="require"`` without TensorRT/CUDA.
    """
    from .staging import commit, staged

    out = Path(out_dir) if out_dir else cfg.output_dir
    final = _prepare_out_dir(out)
    with staged(final, _OUR_NAMES, REPORT_NAME) as (stage, beside):
        run = _Export(cfg, stage, engine, on_stage, validation_batch, heartbeat_s)
        run.final_dir = out
        result = run.run()
        commit(stage, final, beside, _OUR_NAMES)
    return ExportResult(out, result.stages, {role: out / p.relative_to(stage) for role, p in result.artifacts.items()},
                        result.validation, out / MANIFEST_NAME if result.manifest_path else None)


def _write_report(out_dir: Path, stages: list[StageRecord], validation: dict[str, Any]) -> None:
    try:
        write_json_atomic(out_dir / REPORT_NAME, {"passed": False, "stages": [s.to_dict() for s in stages], "validation": validation})
    except OSError:  # pragma: no cover - reporting must never mask the real error
        log.exception("could not write %s", out_dir / REPORT_NAME)
