"""OpenVINO backend (the ``openvino`` extra): OpenVINO's runtime on the CPU, over graphs the export validated.

- "openvino": model.onnx at inference precision f32 (set explicitly: OpenVINO's CPU plugin defaults to bf16
  where the CPU has BF16 math, which is not what FP32 promises);
- "openvino-int8": model.int8.onnx, the same Q/DQ graph ``ort-int8`` runs (the export's validation.int8 gate),
  what stays float in f32;
- "openvino-bf16": model.onnx at inference precision bf16, on a CPU whose OpenVINO lists BF16 among its
  ``OPTIMIZATION_CAPABILITIES`` (AVX512-BF16 or AMX); refused with one line elsewhere (a bf16 hint there would
  silently run f32). Judged by ``validation.bf16``; the export records ``validate-bf16`` where it can run it.

OpenVINO's runtime directly, not ONNX Runtime's OpenVINO execution provider (the ``onnxruntime-ep-openvino``
plugin): measured, the plugin offers no device on an AMD CPU (ONNX Runtime 1.32, plugin 1.8.1), where the runtime
runs; one dependency instead of a second copy of OpenVINO inside a plugin; the precision set and read back on the
compiled model (benchmarks/README.md, "OpenVINO as a backend"). openvino is imported when a backend opens, never at
module import, and never torch.

The graph is compiled once, its batch axis bounded by the manifest's largest batch (one compiled model serves
every batch size: no compile when a server's batch changes); the latency hint, one stream, the configured
threads, threads not pinned to cores (ONNX Runtime's habit too: a pinned thread suffers more when other work
shares its core). Thread-safe: each call takes an infer request from a pool (one per concurrent caller).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ...base._deps import require
from ...base.errors import BackendError
from ...base.vocab import OPENVINO, OPENVINO_BF16, OPENVINO_INT8
from ..manifest_checks import check_graph_io
from .base import BackendBase, BackendOptions

log = logging.getLogger(__name__)

CPU_DEVICE = "CPU"
BF16_CAPABILITY = "BF16"
#: backend name -> (manifest role, OpenVINO inference precision)
VARIANTS = {OPENVINO: ("onnx", "f32"), OPENVINO_INT8: ("onnx-int8", "f32"), OPENVINO_BF16: ("onnx", "bf16")}


def _ov() -> Any:
    return require("openvino", "the OpenVINO backend ('openvino' / 'openvino-int8' / 'openvino-bf16')")


def cpu_capabilities() -> tuple[str, ...]:
    """What OpenVINO's CPU device says it computes natively (``OPTIMIZATION_CAPABILITIES``: FP32, INT8, BF16...)."""
    return tuple(str(c) for c in _ov().Core().get_property(CPU_DEVICE, "OPTIMIZATION_CAPABILITIES"))


def bf16_refusal(capabilities: tuple[str, ...] | None = None) -> str | None:
    """Why openvino-bf16 cannot run here (one line), or None where OpenVINO's CPU device has BF16 math."""
    caps = cpu_capabilities() if capabilities is None else capabilities
    if BF16_CAPABILITY in caps:
        return None
    return (
        f"this CPU has no BF16 math OpenVINO uses (its CPU device lists {', '.join(caps) or 'nothing'}; BF16 needs "
        "AVX512-BF16 or AMX): run openvino or openvino-int8 here"
    )


def _dtype_name(element_type: Any) -> str:
    name = element_type.get_type_name()
    return {"f32": "float32", "f16": "float16", "f64": "float64"}.get(name, name)


def _dims(partial_shape: Any) -> list[Any]:
    """A port's shape as check_graph_io reads it: ints where static, "?" where dynamic."""
    return [d.get_length() if d.is_static else "?" for d in partial_shape]


class OpenVinoBackend(BackendBase):
    """One OpenVINO compiled model on the CPU; float32 in, float32 out."""

    def __init__(
        self,
        path: str | Path,
        input_shape: tuple[int, int, int],
        max_batch: int | None = None,
        options: BackendOptions | None = None,
        name: str = OPENVINO,
        *,
        precision: str = "f32",
        io_check: Any = None,
    ) -> None:
        """``precision``: OpenVINO's inference precision ("f32" | "bf16"); ``io_check(inputs, outputs)`` gets
        the graph's [(name, dtype, shape)] before it is compiled, and raises to refuse it."""
        super().__init__(input_shape, max_batch)
        self.name, self.path, self.precision = name, Path(path), precision
        self.options = options or BackendOptions()
        ov = _ov()
        self._version = ov.get_version().split("-")[0]
        core = ov.Core()
        try:
            model = core.read_model(str(self.path))
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises its own exception types
            raise BackendError(f"{name}: OpenVINO cannot read {self.path}: {str(exc).strip()[:400]}") from exc
        if io_check is not None:
            io_check(*self._signature(model))
        if len(model.inputs) != 1:
            raise BackendError(f"{name}: {self.path} has {len(model.inputs)} inputs, expected one image input")
        self._bound_batch(ov, model)
        names = [o.get_any_name() for o in model.outputs]
        first = "logits" if "logits" in names else names[0]
        self._outputs = [first, *(n for n in names if n != first)]  # run_all's order: the first, then the others
        try:
            self._compiled = core.compile_model(model, CPU_DEVICE, self._config(ov))
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"{name}: OpenVINO cannot compile {self.path}: {str(exc).strip()[:400]}") from exc
        got = self._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if got != precision:  # OpenVINO may refuse a hint it cannot honour; never run another precision silently
            raise BackendError(f"{name}: OpenVINO compiled {self.path.name} at precision {got}, not {precision}")
        self._threads = self._compiled.get_property("INFERENCE_NUM_THREADS")
        self._free: list[Any] = []
        self._lock = threading.Lock()
        log.info("%s: %s compiled on %s (%s, %s threads)", name, self.path.name, CPU_DEVICE, got, self._threads)

    def _config(self, ov: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": "1",
            "ENABLE_CPU_PINNING": False,
            "INFERENCE_PRECISION_HINT": self.precision,
        }
        if self.options.threads:
            config["INFERENCE_NUM_THREADS"] = int(self.options.threads)
        return config

    def _bound_batch(self, ov: Any, model: Any) -> None:
        """The batch axis bounded to [1, max batch] (the rest of the input's shape as the graph has it)."""
        port = model.inputs[0]
        shape = port.get_partial_shape()
        if self.max_batch and shape.rank.is_static and shape[0].is_dynamic:
            shape[0] = ov.Dimension(1, int(self.max_batch))
            model.reshape({port.get_any_name(): shape})

    @staticmethod
    def _signature(model: Any) -> tuple[list[tuple[str, str, list[Any]]], list[tuple[str, str, list[Any]]]]:
        def ports(items: Any) -> list[tuple[str, str, list[Any]]]:
            return [(p.get_any_name(), _dtype_name(p.get_element_type()), _dims(p.get_partial_shape())) for p in items]

        return ports(model.inputs), ports(model.outputs)

    def _request(self) -> Any:
        compiled = self._compiled  # read once: close() on another thread may clear it
        if compiled is None:
            raise BackendError(f"{self.name}: backend is closed")
        with self._lock:
            if self._free:
                return self._free.pop()
        return compiled.create_infer_request()

    def _infer(self, batch: np.ndarray, names: list[str]) -> list[np.ndarray]:
        request = self._request()
        try:
            request.infer({0: batch}, share_inputs=True)
            outs = [np.array(request.get_tensor(n).data, dtype=np.float32, copy=True) for n in names]
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises its own exception types
            raise BackendError(f"{self.name}: OpenVINO failed on a batch of shape {batch.shape}: {exc}") from exc
        with self._lock:
            self._free.append(request)
        return outs

    def _run(self, batch: np.ndarray) -> np.ndarray:
        return self._infer(batch, self._outputs[:1])[0]

    def _run_all(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(self._infer(batch, self._outputs))

    def close(self) -> None:
        self._compiled = None
        with self._lock:
            self._free.clear()

    def describe(self) -> str:
        return f"openvino {self._version} [{CPU_DEVICE}, {self.path.name}, {self.precision}, {self._threads} threads]"


def open_from_artifacts(artifacts: Any, options: BackendOptions | None = None, *, name: str = OPENVINO) -> Any:
    """Backend ``name`` (one of :data:`VARIANTS`) on its verified graph; BackendError for openvino-bf16 on a
    CPU without BF16 math."""
    role, precision = VARIANTS[name]
    if precision == "bf16":
        reason = bf16_refusal()
        if reason:
            raise BackendError(f"{name}: {reason}")
    path = artifacts.onnx_path(role)  # sha256-verified, external data inside the folder

    def io_check(inputs: Any, outputs: Any) -> None:
        check_graph_io(artifacts.schema, path, inputs, outputs, artifacts.manifest_path)

    return OpenVinoBackend(
        path, artifacts.input_shape, artifacts.batch["max"], options, name=name, precision=precision, io_check=io_check
    )


def open_int8_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> Any:
    """ "openvino-int8": model.int8.onnx (the Q/DQ graph ort-int8 runs)."""
    return open_from_artifacts(artifacts, options, name=OPENVINO_INT8)


def open_bf16_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> Any:
    """ "openvino-bf16": model.onnx at BF16 (refused where the CPU has no BF16 math)."""
    return open_from_artifacts(artifacts, options, name=OPENVINO_BF16)
