"""OpenVINO beside ``ort-int8`` in bench_int8.py: FP32, BF16 and NNCF INT8 on the CPU.

A benchmark-only dependency (``openvino``, ``nncf`` for INT8), installed in a separate venv
(benchmarks/README.md, "OpenVINO beside ort-int8"); everything here imports it lazily, so
bench_int8.py runs unchanged without it.

Each variant compiles our plain graph ``model.onnx`` (standard ONNX, what a CPU user would hand
OpenVINO) on the CPU device with the latency hint, one stream and the benchmark's thread count,
at a static shape per batch size (compiled once, before timing: OpenVINO's best case).
``openvino-int8`` is NNCF's post-training quantization of that model (default preset,
``ModelType.TRANSFORMER``) calibrated on the images our own INT8 stage calibrates on.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np

INSTALL = (
    "benchmark-only: `pip install openvino nncf` into a separate venv, never the project's "
    "(benchmarks/README.md, 'OpenVINO beside ort-int8')"
)
NAMES = ("openvino-fp32", "openvino-bf16", "openvino-int8")


def missing() -> str | None:
    """Why the OpenVINO variants cannot run here, or None."""
    if importlib.util.find_spec("openvino") is None:
        return f"openvino variants ({', '.join(NAMES)}) skipped: openvino is not installed; {INSTALL}"
    return None


class OvRunner:
    """An OpenVINO model on the CPU with a ``run(batch) -> logits`` like vitdeploy's backends;
    compiled (static shape) once per batch size."""

    def __init__(self, core: Any, model: Any, name: str, config: dict, input_shape: tuple[int, ...]) -> None:
        self.core, self.model, self.name, self.config = core, model, name, config
        self.input_shape = tuple(input_shape)
        self._requests: dict[int, Any] = {}
        self.compiled_properties: dict[str, str] = {}

    def prepare(self, batch: int) -> Any:
        request = self._requests.get(batch)
        if request is None:
            model = self.model.clone()
            model.reshape([batch, *self.input_shape])
            compiled = self.core.compile_model(model, "CPU", self.config)
            if not self.compiled_properties:  # what OpenVINO made of the hints
                self.compiled_properties = {
                    key: _text(compiled.get_property(key))
                    for key in (
                        "INFERENCE_PRECISION_HINT",
                        "INFERENCE_NUM_THREADS",
                        "NUM_STREAMS",
                        "ENABLE_CPU_PINNING",
                        "EXECUTION_DEVICES",
                    )
                }
            request = self._requests[batch] = compiled.create_infer_request()
        return request

    def run(self, batch: np.ndarray) -> np.ndarray:
        request = self.prepare(len(batch))
        request.infer({0: np.ascontiguousarray(batch, dtype=np.float32)}, share_inputs=True)
        return np.array(request.get_output_tensor(0).data, dtype=np.float32, copy=True)

    def close(self) -> None:
        self._requests.clear()


def _text(value: Any) -> str:
    if hasattr(value, "get_type_name"):  # an openvino.Type: "f32"
        return value.get_type_name()
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _quantized(core: Any, model: Any, calibration: np.ndarray, path: Path) -> Any:
    """NNCF INT8 of ``model`` (cached at ``path``, an OpenVINO IR .xml), one calibration image a sample."""
    import nncf
    import openvino as ov

    if path.is_file():
        print(f"  openvino-int8: reusing {path}", flush=True)
        return core.read_model(str(path))
    nncf.set_log_level(logging.WARNING)
    print(
        f"  openvino-int8: nncf.quantize (default preset, ModelType.TRANSFORMER) on {len(calibration)} "
        f"calibration images ...",
        flush=True,
    )
    samples = [calibration[i : i + 1] for i in range(len(calibration))]
    quantized = nncf.quantize(
        model.clone(), nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(samples)
    )
    tmp = path.with_name(path.stem + ".partial.xml")
    ov.save_model(quantized, str(tmp), compress_to_fp16=False)
    tmp.with_suffix(".bin").replace(path.with_suffix(".bin"))
    tmp.replace(path)
    return quantized


def open_variants(
    onnx_path: Path,
    input_shape: tuple[int, ...],
    threads: int,
    calibration: Callable[[], np.ndarray],
    int8_cache: Path,
    pinning: bool | None = None,
) -> tuple[dict[str, OvRunner], list[str]]:
    """The OpenVINO runners that can run here, and one line for each one that cannot (with why);
    ``pinning`` None leaves ENABLE_CPU_PINNING at OpenVINO's default."""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    core = ov.Core()
    capabilities = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    notes = [
        f"openvino {ov.get_version()} CPU device '{core.get_property('CPU', 'FULL_DEVICE_NAME')}': "
        f"OPTIMIZATION_CAPABILITIES {capabilities}"
    ]
    model = core.read_model(str(onnx_path))

    def config(precision: Any) -> dict:
        out = {
            hints.performance_mode: hints.PerformanceMode.LATENCY,
            props.num_streams: 1,
            props.inference_num_threads: threads,
            hints.inference_precision: precision,
        }
        if pinning is not None:
            out[hints.enable_cpu_pinning] = pinning
        return out

    runners = {"openvino-fp32": OvRunner(core, model, "openvino-fp32", config(ov.Type.f32), input_shape)}
    if "BF16" in capabilities:
        runners["openvino-bf16"] = OvRunner(core, model, "openvino-bf16", config(ov.Type.bf16), input_shape)
    else:
        notes.append(
            "openvino-bf16 skipped: the CPU device does not report BF16 in OPTIMIZATION_CAPABILITIES "
            "(it does on CPUs with AVX512_BF16 or AMX), so a bf16 hint would not run in bf16 here"
        )
    if importlib.util.find_spec("nncf") is None:
        notes.append(f"openvino-int8 skipped: nncf is not installed; {INSTALL}")
    else:
        quantized = _quantized(core, model, calibration(), int8_cache)
        # f32 hint: the INT8 graph's remaining float ops stay in f32, as ort-int8's do
        runners["openvino-int8"] = OvRunner(core, quantized, "openvino-int8", config(ov.Type.f32), input_shape)
    return runners, notes


__all__ = ["INSTALL", "NAMES", "OvRunner", "missing", "open_variants"]
