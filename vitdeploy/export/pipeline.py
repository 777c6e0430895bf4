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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np

from .._files import write_json_atomic
from .._heartbeat import heartbeat
from ..config import PipelineConfig
from ..errors import ArtifactError, BackendError, ConfigError, ExportError, MissingDependencyError, ValidationError
from ..demo import IMAGES_DIR as DEMO_IMAGES_DIR
from ..runtime.artifacts import MANIFEST_NAME
from ..runtime.backends.base import BackendOptions
from ..vocab import ARTIFACT_FILES
from . import manifest as manifest_mod
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


@dataclass(frozen=True)
class _Int8Target:
    """One INT8 graph the export writes (model.int8.onnx for ONNX Runtime, model.int8.trt.onnx for TensorRT)."""

    stage: str  # the stage's name; its validation is "validate-<stage>"
    role: str  # the manifest artifact role
    record: str  # its key under the manifest's "export"
    placement: Any  # export.quantize.Placement
    switch: str  # the pipeline.yaml key that turns it on
    label: str  # how the ONNX Runtime run that judges it is named in reports


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


class _Export:
    """One export run: the stages in order, each timed and reported, the manifest last."""

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
                                 class_token_only=vit.pool == "token" and not vit.distilled)
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

    def _fp16(self, cpu: BackendOptions, vit: Any, onnx_path: Path) -> None:
        """model.fp16.onnx (export/precision.py); with ``export.fp16.autopilot`` the keep-float list is
        chosen by export/autopilot.py, starting from everything FP16 but the floor."""
        from ..runtime.backends.ort import OrtBackend
        from .precision import convert_fp16

        section, path, gate = self.cfg.export.fp16, self.out_dir / FILES["onnx-fp16"], self.cfg.validation.fp16
        args = dict(calibration=self.inputs.batch, input_name=INPUT_NAME, keep_fp32_ops=section.keep_fp32_ops,
                    max_abs_activation=section.max_abs_activation)
        with self.stage("fp16") as rec:
            steps: tuple = ()
            if section.autopilot:
                from .autopilot import GateError, run_fp16_autopilot

                try:
                    pilot = run_fp16_autopilot(onnx_path, path, judge=lambda p: self._judge(p, cpu, "ort-fp16", gate),
                                               depth=vit.depth, **args)
                except GateError as exc:  # the table goes into export-report.json
                    self.validation["validate-fp16"] = {"passed": False, "failures": list(exc.steps[-1].failures),
                                                        "autopilot": [s.to_dict() for s in exc.steps]}
                    raise
                res, steps = pilot.result, pilot.steps
            else:
                res = convert_fp16(onnx_path, path, **args)
            self.extra["fp16"] = {**res.summary(), **({"autopilot": [s.to_dict() for s in steps]} if steps else {})}
            rec.outputs = [path]
            rec.reason = f"{len(res.kept_hot_nodes)} hot node(s) kept float32" + (
                f"; autopilot: {steps[-1].name} ({len(steps)} step(s), {len(res.keep_float)} node(s) float32)" if steps else "")
        self.validate("validate-fp16", lambda: OrtBackend(path, self.chw, None, cpu, name="ort-fp16"), gate, [path])
        self.add("onnx-fp16", path)

    def _int8(self, cpu: BackendOptions, vit: Any) -> None:
        """model.int8.onnx (export/quantize.py) from the fused graph, for ONNX Runtime on the CPU."""
        from .quantize import ORT_CPU

        section = self.cfg.export.int8
        if section.enabled is False:
            self._drop("onnx-int8")
            return self.skip("int8", "export.int8.enabled is false")
        self._quantize(cpu, vit, _Int8Target("int8", "onnx-int8", "int8", ORT_CPU, "export.int8.enabled", "ort-int8"),
                       self.artifacts.get("onnx-ort", self.artifacts["onnx"]), section.mode, section.enabled is True)

    def _int8_tensorrt(self, cpu: BackendOptions, vit: Any) -> None:
        """model.int8.trt.onnx (export/quantize.py, placement TENSORRT) from the plain graph: the graph
        the INT8 TensorRT engine is built from, judged here by ONNX Runtime on the CPU."""
        from .quantize import TENSORRT

        switch = self.cfg.export.int8.tensorrt
        why_not = "export.int8.tensorrt is false" if switch is False else None
        if switch == "auto" and self._tensorrt_unavailable():
            why_not = f"export.int8.tensorrt is auto and no engine is built here: {self._tensorrt_unavailable()}"
        if why_not:
            self._drop("onnx-int8-trt")
            return self.skip("int8-trt", why_not)
        target = _Int8Target("int8-trt", "onnx-int8-trt", "int8_tensorrt", TENSORRT, "export.int8.tensorrt",
                             "ort (model.int8.trt.onnx)")
        self._quantize(cpu, vit, target, self.artifacts["onnx"], "static", switch is True)

    def _drop(self, role: str) -> None:
        path = self.out_dir / FILES[role]
        for p in (path, path.with_name(path.name + ".data")):
            p.unlink(missing_ok=True)

    def _quantize(self, cpu: BackendOptions, vit: Any, target: "_Int8Target", src: Path, mode: str, required: bool) -> None:
        """One INT8 graph: quantize ``src`` (the autopilot when ``export.int8.autopilot``), validate it with
        ONNX Runtime on the CPU, add it. A failure (too few calibration images, the tools failing,
        validation.int8 not met) is fatal when ``required``; otherwise it is recorded in the stage and the
        export goes on without the graph, as the engine does under ``--engine auto``."""
        from ..runtime.backends.ort import OrtBackend
        from . import quantize

        section, out = self.cfg.export.int8, self.out_dir
        path = out / FILES[target.role]
        data = path.with_name(path.name + ".data")
        external = bool(self.entries[self._role_of(src)].get("external_data"))
        record = self.extra[target.record] = {"source": src.name, "mode": mode, "passed": False}
        gate = self.cfg.validation.int8
        try:
            with self.stage(target.stage) as rec, tempfile.TemporaryDirectory(prefix=".int8-pre-", dir=out) as tmp:
                calib = None
                if mode == "static":
                    calib = quantize.calibration_batch(self.inputs.batch, self.inputs.names,
                                                       max_images=section.calibration_images,
                                                       min_images=section.min_calibration_images)
                pre = quantize.prepare(src, Path(tmp) / "pre.onnx", external_data=external, placement=target.placement)
                kwargs = dict(input_name=INPUT_NAME, mode=mode, method=section.calibration_method, calibration=calib,
                              external_data=external, placement=target.placement)
                steps: tuple = ()
                if section.autopilot:
                    from .autopilot import GateError, run_autopilot

                    try:
                        pilot = run_autopilot(pre, path, judge=lambda p: self._judge(p, cpu, target.label, gate),
                                              depth=vit.depth, stage=f"validate-{target.stage}", **kwargs)
                    except GateError as exc:
                        record["autopilot"] = [s.to_dict() for s in exc.steps]
                        raise
                    res, steps = pilot.result, pilot.steps
                    record["autopilot"] = [s.to_dict() for s in steps]
                else:
                    res = quantize.quantize_prepared(pre, path, **kwargs)
                record.update(res.summary())
                ops = "/".join(target.placement.op_types)
                if not res.quantized_nodes:
                    log.warning("%s passes validation.int8 only with every %s in float: it runs at FP32 speed (loosen "
                                "validation.int8, or set %s: false)", path.name, ops, target.switch)
                rec.outputs = [path, *res.external_data]
                rec.reason = (f"{len(res.quantized_nodes)} {ops} INT8, {len(res.keep_float)} float"
                              + (f" (autopilot, {len(steps)} step(s))" if steps else "") + f", {mode}"
                              + (f", {res.method} on {res.calibration_images} images" if res.method else
                                 f"; {quantize.DYNAMIC_CAVEAT}"))
            self.validate(f"validate-{target.stage}", lambda: OrtBackend(path, self.chw, None, cpu, name=target.label),
                          gate, [path, *res.external_data])
            record["passed"] = True
        except (ConfigError, ExportError, BackendError, ValidationError) as exc:
            if required:
                raise
            log.warning("%s not written (%s: auto; the export goes on without it): %s", path.name, target.switch,
                        str(exc).splitlines()[0])
            for p in (path, data):
                for q in (p, p.with_name(p.name + ".rejected")):
                    q.unlink(missing_ok=True)
            return
        self.add(target.role, path, res.external_data)

    def _judge(self, path: Path, cpu: BackendOptions, label: str, tolerance: Any) -> Any:
        """One autopilot step: the candidate graph at the largest validation batch against eager PyTorch."""
        from ..runtime.backends.ort import OrtBackend
        from .compare import compare
        from .validate import run_in_batches

        backend = OrtBackend(path, self.chw, None, cpu, name=label)
        try:
            logits = run_in_batches(backend, self.inputs.batch, max(self.sizes))
        finally:
            backend.close()
        return compare(self.reference, logits, tolerance.model_dump())

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

    def _tensorrt_device(self) -> str:
        device = self.cfg.runtime.device
        return device if device.startswith("cuda") else "cuda:0"  # build where it will run

    def _tensorrt_unavailable(self) -> str | None:
        """Why no TensorRT engine can be built in this export (None when one can); asked once."""
        if not hasattr(self, "_trt_reason"):
            if self.engine_mode == "skip":
                self._trt_reason: str | None = "--engine skip"
            else:
                from . import tensorrt as trt_stage

                self._trt_reason = trt_stage.tensorrt_unavailable_reason(self._tensorrt_device())
        return self._trt_reason

    def _engine(self) -> None:
        """model.engine from model.fp16.onnx, then model.int8.engine from model.int8.trt.onnx when the
        export wrote that graph. ``--engine require`` makes a failure of the FP16 engine fatal, and of the
        INT8 engine too when ``export.int8.tensorrt`` is true; otherwise a failure is recorded and the
        export goes on without that engine."""
        mode = self.engine_mode
        if mode == "skip":
            return self.skip("engine", "--engine skip")
        why_not = ("the engine is compiled from model.fp16.onnx and export.fp16.enabled is false"
                   if "onnx-fp16" not in self.artifacts else self._tensorrt_unavailable())
        if why_not:
            if mode == "require":
                with self.stage("engine"):
                    raise MissingDependencyError(f"TensorRT engine required (--engine require) but {why_not}")
            self.skip("engine", why_not)
        else:
            self._engine_from("engine", "onnx-fp16", "fp16", self.cfg.validation.fp16, required=mode == "require")
        if "onnx-int8-trt" in self.artifacts:  # written only where TensorRT can run, or when asked for
            why_not = self._tensorrt_unavailable()
            if why_not:
                return self.skip("engine-int8", why_not)
            self._engine_from("engine-int8", "onnx-int8-trt", "int8", self.cfg.validation.int8,
                              required=mode == "require" and self.cfg.export.int8.tensorrt is True)

    def _engine_from(self, role: str, source: str, precision: str, tolerance: Any, *, required: bool) -> None:
        """Build the engine ``role`` (stage of the same name) from the ONNX graph ``source`` and validate
        it on the GPU (``validate-<role>``) with ``tolerance``."""
        from ..runtime.backends.trt import TrtBackend
        from . import tensorrt as trt_stage

        cfg, profile, device = self.cfg, self.cfg.export.batch, self._tensorrt_device()
        engine_path, meta_path = self.out_dir / FILES[role], self.out_dir / FILES[f"{role}-meta"]
        try:
            with self.stage(role) as rec:
                plan = trt_stage.plan_engine_build(
                    self.artifacts[source], engine_path, input_name=INPUT_NAME, chw=self.chw, min_batch=profile.min,
                    opt_batch=profile.opt, max_batch=profile.max, workspace_mb=cfg.tensorrt.workspace_mb,
                    optimization_level=cfg.tensorrt.optimization_level, device=device, precision=precision,
                    timing_cache_path=cfg.resolve(cfg.tensorrt.timing_cache) or self.out_dir / "timing.cache")

                shown = [0.0]

                def progress(text: str) -> None:  # at most one line a second
                    if time.perf_counter() - shown[0] >= 1.0:
                        shown[0], rec.reason = time.perf_counter(), text
                        self._emit(rec)

                try:
                    trt_stage.build_engine(plan, progress=progress)
                except BaseException:
                    rec.reason = ""  # the stage records the error, not the last progress line
                    raise
                rec.reason = f"built on {device}"
                rec.outputs = [engine_path, meta_path]
            gpu = BackendOptions(device=device)
            in_profile = tuple(sorted({min(max(b, profile.min), profile.max) for b in self.sizes}))
            name = "trt" if precision == "fp16" else f"trt-{precision}"
            self.validate(f"validate-{role}", lambda: TrtBackend(engine_path, meta_path, self.chw, profile.max, gpu, name=name),
                          tolerance, [engine_path, meta_path], in_profile)
        except (ExportError, BackendError, ArtifactError, MissingDependencyError, ValidationError) as exc:
            # validation.fp16 missed by the FP16 engine fails the export (exit 3), as every FP16 artifact does;
            # the INT8 engine is optional like the INT8 graphs (unless required)
            if required or (isinstance(exc, ValidationError) and precision == "fp16"):
                raise
            # the validated ONNX artifacts stay usable; the manifest records why there is no engine.
            log.warning("TensorRT %s not built (the export goes on without it): %s", engine_path.name, exc)
            for p in (engine_path, meta_path):
                for q in (p, p.with_name(p.name + ".rejected")):
                    q.unlink(missing_ok=True)
            return
        self.add(role, engine_path)
        self.add(f"{role}-meta", meta_path)

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
