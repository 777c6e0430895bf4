"""The export's TensorRT engine stages: model.engine from model.fp16.onnx and model.int8.engine from
model.int8.trt.onnx (export/tensorrt.py builds both), each validated on the GPU it was built on. A
mixin of the export run (export/pipeline.py ``_Export``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..errors import ArtifactError, BackendError, ExportError, MissingDependencyError, ValidationError
from ..runtime.backends.base import BackendOptions
from ..vocab import ARTIFACT_FILES as FILES
from .onnx import INPUT_NAME

log = logging.getLogger(__name__)


class EngineStages:
    """The TensorRT engine stages of ``_Export``."""

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
