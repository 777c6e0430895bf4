"""The export's reduced-precision graph stages: model.fp16.onnx, model.int8.onnx (ONNX Runtime on the
CPU) and model.int8.trt.onnx (TensorRT), each chosen by the precision autopilot where asked and
validated with ONNX Runtime on the CPU. A mixin of the export run (export/pipeline.py ``_Export``):
it uses the run's stages, validation inputs, reference logits and artifact bookkeeping.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendError, ConfigError, ExportError, ValidationError
from ..runtime.backends.base import BackendOptions
from ..vocab import ARTIFACT_FILES as FILES
from .onnx import INPUT_NAME

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Int8Target:
    """One INT8 graph the export writes (model.int8.onnx for ONNX Runtime, model.int8.trt.onnx for TensorRT)."""

    stage: str  # the stage's name; its validation is "validate-<stage>"
    role: str  # the manifest artifact role
    record: str  # its key under the manifest's "export"
    placement: Any  # export.quantize.Placement
    switch: str  # the pipeline.yaml key that turns it on
    label: str  # how the ONNX Runtime run that judges it is named in reports
    timed_against: bool = False  # shipped only at export.int8.min_speedup x its source graph's speed here


class PrecisionStages:
    """The FP16 and INT8 graph stages of ``_Export``."""

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
        self._quantize(cpu, vit, _Int8Target("int8", "onnx-int8", "int8", ORT_CPU, "export.int8.enabled", "ort-int8", True),
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
            if target.timed_against and not self._worth_running(path, src, cpu, target, calib, record, required):
                for p in (path, data):
                    p.unlink(missing_ok=True)
                return
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

    def _worth_running(self, path: Path, src: Path, cpu: BackendOptions, target: "_Int8Target",
                       calib: Any, record: dict, required: bool) -> bool:
        """Time the validated INT8 graph against ``src`` (speed-int8 stage); below
        ``export.int8.min_speedup`` the graph is not shipped (required: ExportError)."""
        from ..runtime.backends.ort import OrtBackend
        from .int8_speed import measure

        minimum = self.cfg.export.int8.min_speedup
        with self.stage(f"speed-{target.stage}") as rec:
            if minimum <= 0:
                rec.status, rec.reason = "skipped", "export.int8.min_speedup is 0: shipped without timing"
                return True
            rows = calib if calib is not None else self.inputs.batch
            batch = np.ascontiguousarray(rows[: max(1, min(len(rows), self.cfg.export.batch.opt))], dtype=np.float32)
            int8, base = OrtBackend(path, self.chw, None, cpu, name=target.label), OrtBackend(src, self.chw, None, cpu)
            try:
                check = measure(int8, base, batch, minimum)
            finally:
                int8.close()
                base.close()
            record["speed"] = check.to_dict()
            verdict = check.describe(src.name)
            if check.worth_it:
                rec.reason = verdict
                return True
            why = (f"{path.name} not shipped: {verdict}, below export.int8.min_speedup {minimum:g}; INT8 does not pay "
                   f"for this model on this machine (set export.int8.min_speedup: 0 to ship it anyway)")
            if required:
                raise ExportError(why)
            rec.status, rec.reason = "skipped", why
            record["shipped"] = False
            log.info("%s", why)
            return False

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
