"""`vitdeploy export`: the stages composed. Each stage is a small function with plain inputs and
outputs (see the sibling modules); this module runs the ones the config asks for, times them,
reports them through a callback and writes the manifest last.

A manifest is the only mark of a valid export: it is removed when an export starts and written
only when every stage that ran has passed. An artifact that fails validation is renamed
``<name>.rejected`` so nothing loads it as valid; its report is ``export-report.json``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from .._files import write_json_atomic
from ..config import PipelineConfig
from ..errors import ExportError, MissingDependencyError, ValidationError
from ..paths import DEMO_IMAGES_DIR, DEMO_MODEL_DIR
from ..runtime.artifacts import MANIFEST_NAME
from ..runtime.backends.base import BackendOptions
from ..runtime.preprocess_spec import PreprocessSpec
from . import manifest as manifest_mod
from .onnx import INPUT_NAME, OUTPUT_NAME, export_onnx
from .validate import ValidationInputs, build_inputs, validate_artifact, validation_batch_sizes

log = logging.getLogger(__name__)

EngineMode = Literal["auto", "require", "skip"]
REPORT_NAME = "export-report.json"
FILES = {"weights": "model.safetensors", "weights-config": "model.json", "onnx": "model.onnx",
         "onnx-fp16": "model.fp16.onnx", "engine": "model.engine", "engine-meta": "model.engine.json"}


@dataclass
class StageRecord:
    name: str
    status: str  # "passed" | "failed" | "skipped"
    seconds: float = 0.0
    reason: str = ""
    outputs: list[Path] = field(default_factory=list)

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


def load_model(cfg: PipelineConfig) -> Any:
    """Stage 1: the checkpoint named in the config (absent = the embedded demo model), with the
    preprocessing the checkpoint carries overridden by ``preprocess`` keys that are set."""
    from ..model.checkpoints import load_checkpoint

    path = cfg.resolve(cfg.model.checkpoint) or DEMO_MODEL_DIR
    return load_checkpoint(path, image_size=cfg.model.image_size, variant=cfg.model.variant)


def resolve_preprocess(cfg: PipelineConfig, loaded: Any) -> PreprocessSpec:
    size = loaded.config.image_size
    spec = loaded.preprocess or PreprocessSpec(style="hf", height=size, width=size)
    overrides = {k: v for k, v in cfg.preprocess.model_dump().items() if v is not None}
    spec = spec.replace(**overrides, height=size, width=size)
    return spec


def validation_images(cfg: PipelineConfig) -> list[Path]:
    from ..runtime.images import iter_image_paths

    folder = cfg.resolve(cfg.validation.images) or (DEMO_IMAGES_DIR if DEMO_IMAGES_DIR.is_dir() else None)
    if folder is None:
        return []
    return iter_image_paths([folder])[: cfg.validation.max_images]


def reference_logits(model: Any, batch: np.ndarray, chunk: int = 16) -> np.ndarray:
    import torch

    with torch.inference_mode():
        outs = [model(torch.from_numpy(batch[i : i + chunk])).float().numpy() for i in range(0, len(batch), chunk)]
    return np.concatenate(outs)


def _prepare_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create output directory {out_dir}: {exc.strerror}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ExportError(f"output directory {out_dir} is not writable")
    # The old manifest vouches for files this export is about to replace.
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)


def _reject(paths: list[Path]) -> None:
    for path in paths:
        if path.exists():
            os.replace(path, path.with_name(path.name + ".rejected"))


def run_export(
    cfg: PipelineConfig,
    out_dir: Path | None = None,
    *,
    engine: EngineMode = "auto",
    on_stage: StageCallback | None = None,
    validation_batch: tuple[int, ...] | None = None,
) -> ExportResult:
    """Run every stage; raise ValidationError (exit 3) after writing the report if one fails."""
    out_dir = Path(out_dir) if out_dir else cfg.output_dir
    _prepare_out_dir(out_dir)
    stages: list[StageRecord] = []
    artifacts: dict[str, Path] = {}
    entries: dict[str, dict[str, Any]] = {}
    validation: dict[str, Any] = {}
    extra: dict[str, Any] = {}

    def record(rec: StageRecord) -> StageRecord:
        stages.append(rec)
        if on_stage:
            on_stage(rec)
        return rec

    def timed(name: str, fn: Callable[[], list[Path]]) -> None:
        start = time.perf_counter()
        try:
            outputs = fn()
        except BaseException as exc:
            record(StageRecord(name, "failed", time.perf_counter() - start, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            _write_report(out_dir, stages, validation)
            raise
        record(StageRecord(name, "passed", time.perf_counter() - start, outputs=outputs))

    def fail_validation(stage: str, files: list[Path], result: Any) -> None:
        validation[stage] = result.to_dict()
        _reject(files)
        stages[-1].status, stages[-1].reason = "failed", "; ".join(result.failures[:6])
        _write_report(out_dir, stages, validation)
        raise ValidationError(
            f"{stage}: {result.backend} output drifted beyond validation thresholds: " + "; ".join(result.failures[:6])
            + f" (artifact renamed *.rejected; full report: {out_dir / REPORT_NAME})"
        )

    state: dict[str, Any] = {}

    # 1. Model -------------------------------------------------------------------------------
    def stage_model() -> list[Path]:
        from ..model.checkpoints import save_checkpoint

        loaded = load_model(cfg)
        state["loaded"] = loaded
        state["spec"] = resolve_preprocess(cfg, loaded)
        state["name"] = cfg.model.name or loaded.name
        save_checkpoint(out_dir, loaded.model, loaded.labels, state["spec"], state["name"])
        return [out_dir / FILES["weights"], out_dir / FILES["weights-config"]]

    timed("model", stage_model)
    loaded, spec = state["loaded"], state["spec"]
    vit = loaded.config
    chw = (vit.in_channels, vit.image_size, vit.image_size)
    for role in ("weights", "weights-config"):
        artifacts[role] = out_dir / FILES[role]
    profile = cfg.export.batch
    metadata = {"vitdeploy.name": state["name"], "vitdeploy.labels": list(loaded.labels),
                "vitdeploy.preprocess": spec.to_dict(), "vitdeploy.vit": vit.to_dict()}

    # 2. ONNX FP32 ----------------------------------------------------------------------------
    def stage_onnx() -> list[Path]:
        art = export_onnx(loaded.model, out_dir / FILES["onnx"], image_size=vit.image_size, in_channels=vit.in_channels,
                          opset=cfg.export.opset, metadata=metadata,
                          external_data_threshold_mb=cfg.export.external_data_threshold_mb)
        state["onnx_external"] = list(art.external_data)
        return [art.path, *art.external_data]

    timed("onnx", stage_onnx)
    artifacts["onnx"] = out_dir / FILES["onnx"]

    # 3. Validate FP32 in ONNX Runtime (CPU) ----------------------------------------------------
    from ..runtime.preprocess import Preprocessor

    preprocessor = Preprocessor(spec)
    sizes = validation_batch or validation_batch_sizes(profile.max)
    inputs: ValidationInputs = build_inputs(preprocessor, validation_images(cfg), noise_samples=cfg.validation.noise_samples,
                                            seed=cfg.validation.seed, min_count=max(sizes))
    reference = reference_logits(loaded.model, inputs.batch)
    cpu = BackendOptions(device="cpu", providers=("CPUExecutionProvider",))

    def stage_validate(stage: str, backend_factory: Callable[[], Any], tolerance: Any, files: list[Path]) -> None:
        start = time.perf_counter()
        record(StageRecord(stage, "running"))
        backend = backend_factory()
        try:
            result = validate_artifact(stage, backend, inputs, reference, tolerance.model_dump(), sizes)
        finally:
            backend.close()
        stages[-1].seconds = time.perf_counter() - start
        if not result.passed:
            fail_validation(stage, files, result)
        validation[stage] = result.to_dict()
        stages[-1].status = "passed"
        stages[-1].reason = f"{len(inputs.names)} inputs at batch {', '.join(map(str, sizes))}; worst max|diff| {result.worst_metrics()['max_abs_diff']:.3g}"
        if on_stage:
            on_stage(stages[-1])

    from ..runtime.backends.ort import OrtBackend

    stage_validate("validate-onnx", lambda: OrtBackend(artifacts["onnx"], chw, None, cpu, name="ort"), cfg.validation.fp32,
                   [artifacts["onnx"]])
    entries["onnx"] = manifest_mod.file_entry(artifacts["onnx"], out_dir, state["onnx_external"])

    # 4-5. FP16 graph + validation --------------------------------------------------------------
    if cfg.export.fp16.enabled:
        from .precision import convert_fp16

        def stage_fp16() -> list[Path]:
            res = convert_fp16(artifacts["onnx"], out_dir / FILES["onnx-fp16"], calibration=inputs.batch, input_name=INPUT_NAME,
                               keep_fp32_ops=cfg.export.fp16.keep_fp32_ops, max_abs_activation=cfg.export.fp16.max_abs_activation)
            extra["fp16"] = res.summary()
            return [res.path]

        timed("fp16", stage_fp16)
        artifacts["onnx-fp16"] = out_dir / FILES["onnx-fp16"]
        stage_validate("validate-fp16", lambda: OrtBackend(artifacts["onnx-fp16"], chw, None, cpu, name="ort-fp16"),
                       cfg.validation.fp16, [artifacts["onnx-fp16"]])
        entries["onnx-fp16"] = manifest_mod.file_entry(artifacts["onnx-fp16"], out_dir)
    else:
        (out_dir / FILES["onnx-fp16"]).unlink(missing_ok=True)
        record(StageRecord("fp16", "skipped", reason="export.fp16.enabled is false"))

    # 6-7. TensorRT engine + validation --------------------------------------------------------
    _engine_stages(cfg, engine, out_dir, artifacts, entries, chw, record, timed, stage_validate)

    # 8. Manifest -----------------------------------------------------------------------------
    for role in ("weights", "weights-config"):
        entries[role] = manifest_mod.file_entry(artifacts[role], out_dir)
    start = time.perf_counter()
    manifest = manifest_mod.build_manifest(
        name=state["name"], vit=vit.to_dict(), source={"path": str(cfg.resolve(cfg.model.checkpoint) or "demo"), "format": loaded.source_format},
        labels=loaded.labels, preprocess=spec.to_dict(), input_name=INPUT_NAME, output_name=OUTPUT_NAME, chw=chw,
        batch=profile.model_dump(), artifacts=entries, validation=validation,
        stages=[s.to_dict() for s in stages] + [{"name": "manifest", "status": "passed", "seconds": 0.0, "reason": "", "outputs": [MANIFEST_NAME]}],
        extra={"export": extra, "validation_inputs": {"count": len(inputs.names), "images": sum(not n.startswith("noise:") for n in inputs.names), "batch_sizes": list(sizes)}},
    )
    path = manifest_mod.write_manifest(out_dir, manifest)
    (out_dir / REPORT_NAME).unlink(missing_ok=True)
    record(StageRecord("manifest", "passed", time.perf_counter() - start, outputs=[path]))
    return ExportResult(out_dir, stages, artifacts, validation, path)


def _engine_stages(cfg, engine, out_dir, artifacts, entries, chw, record, timed, stage_validate) -> None:
    engine_path, meta_path = out_dir / FILES["engine"], out_dir / FILES["engine-meta"]
    if engine == "skip":
        record(StageRecord("engine", "skipped", reason="--engine skip"))
        return
    if "onnx-fp16" not in artifacts:
        reason = "the engine is compiled from model.fp16.onnx and export.fp16.enabled is false"
        if engine == "require":
            raise MissingDependencyError(f"TensorRT engine required but {reason}")
        record(StageRecord("engine", "skipped", reason=reason))
        return
    from . import tensorrt as trt_stage

    why_not = trt_stage.tensorrt_unavailable_reason()
    if why_not:
        if engine == "require":
            record(StageRecord("engine", "failed", reason=why_not))
            raise MissingDependencyError(f"TensorRT engine required (--engine require) but {why_not}")
        record(StageRecord("engine", "skipped", reason=why_not))
        return
    profile = cfg.export.batch
    plan = trt_stage.plan_engine_build(
        artifacts["onnx-fp16"], engine_path, input_name=INPUT_NAME, chw=chw, min_batch=profile.min, opt_batch=profile.opt,
        max_batch=profile.max, workspace_mb=cfg.tensorrt.workspace_mb, optimization_level=cfg.tensorrt.optimization_level,
        timing_cache_path=cfg.timing_cache)
    timed("engine", lambda: (trt_stage.build_engine(plan), [engine_path, meta_path])[1])
    artifacts["engine"], artifacts["engine-meta"] = engine_path, meta_path
    from ..runtime.backends.trt import TrtBackend

    gpu = BackendOptions(device="cuda")
    stage_validate("validate-engine", lambda: TrtBackend(engine_path, meta_path, chw, profile.max, gpu), cfg.validation.fp16,
                   [engine_path, meta_path])
    entries["engine"] = manifest_mod.file_entry(engine_path, out_dir)
    entries["engine-meta"] = manifest_mod.file_entry(meta_path, out_dir)


def _write_report(out_dir: Path, stages: list[StageRecord], validation: dict[str, Any]) -> None:
    try:
        write_json_atomic(out_dir / REPORT_NAME, {"passed": False, "stages": [s.to_dict() for s in stages], "validation": validation})
    except OSError:  # pragma: no cover - reporting must never mask the real error
        log.exception("could not write %s", out_dir / REPORT_NAME)
