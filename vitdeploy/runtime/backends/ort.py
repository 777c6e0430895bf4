"""ONNX Runtime backend: "ort" runs model.ort.onnx when the manifest has it (an ORT-only FP32 graph
with contrib ops, see export/optimize.py) and model.onnx otherwise; "ort-fp16" runs model.fp16.onnx;
"ort-int8" runs model.int8.onnx (export/quantize.py).

onnxruntime is imported when a session is created, never at module import, and never torch.
One InferenceSession serves every thread: ``InferenceSession.run`` is thread-safe.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...base._deps import require
from ...base.errors import BackendError, ConfigError
from ...base.vocab import ORT_FP16, ORT_INT8, TRT_EP_CACHE
from ..artifacts import check_onnx_external_data
from ..cuda import cuda_index
from ..local_cache import user_cache_dir, writable_dir
from ..manifest_checks import check_graph_io, onnx_dtype_name
from .base import BackendBase, BackendOptions, provider_name

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
# Providers that mean "run on the accelerator": ending on CPU alone is then a failure.
ACCELERATOR_PROVIDERS = (
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "ROCMExecutionProvider",
    "MIGraphXExecutionProvider",
    "DmlExecutionProvider",
    "CoreMLExecutionProvider",
    "OpenVINOExecutionProvider",
)

_NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}
# Providers with kernels for the contrib ops of model.ort.onnx (TensorRT EP has none: it gets model.onnx).
ORT_GRAPH_PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider")
#: The session settings model.int8.onnx runs with. Its attention keys and values are signed INT8; on x86
#: ONNX Runtime turns signed activations into unsigned ones by default, and its unsigned x unsigned INT8
#: kernels are the slow ones (attention's two products took 1.4-1.6x the time, ViT-B/16). The answers are the same
#: bit for bit either way (tested): this is a speed setting only.
INT8_SESSION_CONFIG = (("session.qdqisint8allowed", "1"),)


def _ort():
    return require("onnxruntime", "the ONNX Runtime backend ('ort' / 'ort-fp16' / 'ort-int8')")


def available_providers() -> list[str]:
    """Providers the installed onnxruntime build offers (empty when onnxruntime is missing)."""
    try:
        return list(_ort().get_available_providers())
    except Exception:  # noqa: BLE001 - missing or broken install: nothing available
        return []


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _allow_spinning(options: BackendOptions) -> bool:
    """Whether idle intra-op threads busy-wait for the next operator (ORT's default) or block.

    ``options.ort_allow_spinning`` (True / False) decides; by default ("auto") threads spin only when the
    session leaves a core free. When its threads take every core the process may use, a spinning
    thread competes with every other thread (preprocessing, the server, other processes): ViT-B/16 at
    2 threads on 2 cores ran 20-35% slower with spinning under load, 1-7% faster without any load
    (benchmarks/README.md)."""
    setting = options.ort_allow_spinning
    if isinstance(setting, bool):
        return setting
    cores = _usable_cores()
    threads = int(options.threads) if options.threads else cores  # ORT's default: one per core
    return threads < cores


_provider_name = provider_name
DEVICE_ID_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def _split_provider(entry: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    if (
        isinstance(entry, (tuple, list))
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], dict)
    ):
        return entry[0], dict(entry[1])
    raise ConfigError(f"runtime.providers entry {entry!r}: expected a provider name or [name, {{option: value}}]")


def trt_ep_cache_dir(artifacts_dir: str | Path) -> Path:
    """Where the TensorRT EP keeps its engines and timing cache: ``<artifacts>/ort-trt-cache`` when
    that folder can be written, else a per-artifacts folder under the user's cache
    (``$XDG_CACHE_HOME`` or ~/.cache ``/vitdeploy/ort-trt/<hash of the artifacts path>``)."""
    artifacts_dir = Path(artifacts_dir).resolve()
    beside = artifacts_dir / TRT_EP_CACHE
    try:
        beside.mkdir(exist_ok=True)
        if writable_dir(beside):
            return beside
    except OSError:
        pass
    fallback = user_cache_dir(artifacts_dir, "ort-trt")
    log.info("%s is not writable; the TensorRT EP caches engines in %s", beside, fallback)
    return fallback


def provider_entries(
    requested: Any,
    *,
    device: str,
    input_name: str,
    chw: tuple[int, int, int],
    batch: dict[str, int] | None,
    fp16_graph: bool,
    cache_dir: Path | None,
) -> list[tuple[str, dict[str, Any]]]:
    """The (name, options) list handed to ONNX Runtime for ``requested`` providers (pure).

    - CUDA and TensorRT EPs get ``device_id`` from ``device`` ("cuda:N"; "cpu"/"cuda" mean 0).
    - The TensorRT EP gets engine and timing caches in ``cache_dir`` (so a process reuses the
      engines built before it instead of rebuilding them), the batch profile as explicit
      min/opt/max shapes of ``input_name``, and FP16 kernels when the graph is the FP16 one
      (``trt_fp16_enable``; the FP32 "ort" graph stays FP32 unless asked).
    - Options given in pipeline.yaml (``[name, {option: value}]``) override these defaults.
    """
    index = cuda_index(device) if str(device).startswith("cuda") else 0
    entries = []
    for entry in requested:
        name, given = _split_provider(entry)
        options: dict[str, Any] = {}
        if name in DEVICE_ID_PROVIDERS:
            options["device_id"] = index
        if name == "TensorrtExecutionProvider":
            if fp16_graph:
                options["trt_fp16_enable"] = True
            if cache_dir is not None:
                options.update(
                    trt_engine_cache_enable=True,
                    trt_engine_cache_path=str(cache_dir),
                    trt_timing_cache_enable=True,
                    trt_timing_cache_path=str(cache_dir),
                )
            if batch:
                dims = "x".join(str(int(d)) for d in chw)
                for key in ("min", "opt", "max"):
                    options[f"trt_profile_{key}_shapes"] = f"{input_name}:{int(batch[key])}x{dims}"
        options.update(given)
        entries.append((name, options))
    return entries


class OrtBackend(BackendBase):
    """An ``onnxruntime.InferenceSession`` on one ONNX file; float32 in, float32 logits out."""

    def __init__(
        self,
        onnx_path: str | Path,
        input_shape: tuple[int, int, int],
        max_batch: int | None = None,
        options: BackendOptions | None = None,
        name: str = "ort",
        *,
        external_data_checked: bool = False,
        io_check: Callable[[Any, Any], None] | None = None,
        session_config: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """``external_data_checked``: the caller (``verified_onnx_path``) already refused external
        data outside the model's folder; skip reading the graph a second time. ``io_check(inputs,
        outputs)``: called with the session's [(name, dtype, shape)] before anything else looks at
        them (the manifest check of ``open_from_artifacts``); it raises to refuse the graph.
        ``session_config``: ONNX Runtime session config entries (key, value) the graph runs with
        (:data:`INT8_SESSION_CONFIG` for model.int8.onnx)."""
        super().__init__(input_shape, max_batch)
        self.name = name
        self.session_config = tuple(session_config)
        self.options = options or BackendOptions()
        self.onnx_path = Path(onnx_path)
        ort = _ort()
        self._version = ort.__version__
        if not external_data_checked:
            check_onnx_external_data(self.onnx_path)

        requested = list(self.options.providers) or [CPU_PROVIDER]
        offered = set(ort.get_available_providers())
        providers = [p for p in requested if _provider_name(p) in offered]
        dropped = [_provider_name(p) for p in requested if _provider_name(p) not in offered]
        if dropped:
            log.warning(
                "%s: providers %s are not in this onnxruntime build (available: %s)", name, dropped, sorted(offered)
            )
        wants_accelerator = any(_provider_name(p) in ACCELERATOR_PROVIDERS for p in requested)
        if not providers:
            providers = [CPU_PROVIDER]

        self._session = self._new_session(ort, providers)
        self.providers = list(self._session.get_providers())
        log.info("%s: %s running on %s", name, self.onnx_path.name, self.providers)
        not_loaded = [_provider_name(p) for p in providers if _provider_name(p) not in self.providers]
        if not_loaded:
            log.warning(
                "%s: providers %s are in this onnxruntime build but did not load (a missing CUDA/cuDNN/TensorRT "
                "library or a bad option; run with -vv and see ONNX Runtime's own log); running on %s",
                name,
                not_loaded,
                self.providers,
            )
        if wants_accelerator and all(p == CPU_PROVIDER for p in self.providers):
            asked = [_provider_name(p) for p in requested]
            msg = (
                f"{name}: asked for providers {asked} but the session runs on CPU only "
                f"(available in this onnxruntime: {sorted(offered)}); install onnxruntime-gpu with a matching "
                f"CUDA/cuDNN, or set runtime.allow_cpu_fallback: true to accept CPU"
            )
            if not self.options.allow_cpu_fallback:
                self._session = None
                raise BackendError(msg)
            log.warning("%s (allowed by allow_cpu_fallback)", msg)

        self._check_io(io_check)

    def _new_session(self, ort: Any, providers: list[Any]) -> Any:
        """The InferenceSession: sequential, this backend's intra-op threads and spinning, errors-only log."""
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads = 1  # the sequential executor never uses the inter-op pool
        if self.options.threads:
            so.intra_op_num_threads = int(self.options.threads)
        spin = _allow_spinning(self.options)
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "1" if spin else "0")
        for key, value in self.session_config:
            so.add_session_config_entry(key, value)
        so.log_severity_level = 3  # errors only; provider fallbacks are reported below, once
        try:
            return ort.InferenceSession(str(self.onnx_path), sess_options=so, providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise BackendError(
                f"{self.name}: ONNX Runtime cannot load {self.onnx_path} with providers "
                f"{[_provider_name(p) for p in providers]}: {str(exc).strip()}; re-export with "
                f"`vitdeploy export` or check the onnxruntime install"
            ) from exc

    def _check_io(self, io_check: Callable[[Any, Any], None] | None) -> None:
        """One float image input of the expected shape (the caller's ``io_check`` first); the output names."""
        name = self.name
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        if io_check is not None:
            try:
                io_check(*self.signature())
            except BaseException:
                self._session = None
                raise
        if len(inputs) != 1:
            raise BackendError(
                f"{name}: {self.onnx_path} has {len(inputs)} inputs "
                f"{[i.name for i in inputs]}, expected exactly one image input"
            )
        self.input_name = inputs[0].name
        self._input_dtype = _NP_TYPES.get(inputs[0].type)
        if self._input_dtype is None:
            raise BackendError(
                f"{name}: {self.onnx_path} input {self.input_name!r} has type {inputs[0].type}, "
                f"expected tensor(float) or tensor(float16)"
            )
        static = [d for d in inputs[0].shape[1:]]
        if len(inputs[0].shape) != 4 or any(isinstance(d, int) and d != e for d, e in zip(static, self.input_shape)):
            raise BackendError(
                f"{name}: {self.onnx_path} input {self.input_name!r} has shape {inputs[0].shape}, "
                f"expected [batch, {', '.join(map(str, self.input_shape))}]; the model and manifest "
                f"disagree, re-run `vitdeploy export`"
            )
        names = [o.name for o in outputs]
        self.output_name = "logits" if "logits" in names else names[0]
        self.output_names = names
        #: what run_all returns, in order: the first output, then the others as the graph lists them
        self._all_names = [self.output_name, *(n for n in names if n != self.output_name)]

    def signature(self) -> tuple[list[tuple[str, str, list[Any]]], list[tuple[str, str, list[Any]]]]:
        """([(name, dtype, shape)] of the inputs, same of the outputs); dtype as 'float32'/'float16'."""
        session = self._live_session()
        return (
            [(i.name, onnx_dtype_name(i.type), list(i.shape)) for i in session.get_inputs()],
            [(o.name, onnx_dtype_name(o.type), list(o.shape)) for o in session.get_outputs()],
        )

    def _live_session(self) -> Any:
        # Read self._session once: close() on another thread may set it to None at any moment.
        session = self._session
        if session is None:
            raise BackendError(f"{self.name}: backend is closed")
        return session

    def _run(self, batch: np.ndarray) -> np.ndarray:
        session = self._live_session()
        feed = batch if self._input_dtype is np.float32 else batch.astype(self._input_dtype)
        try:
            (out,) = session.run([self.output_name], {self.input_name: feed})
        except Exception as exc:  # noqa: BLE001
            raise BackendError(
                f"{self.name}: ONNX Runtime failed on a batch of shape {batch.shape}: {str(exc).strip()}"
            ) from exc
        return np.asarray(out, dtype=np.float32)

    def _run_all(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(self._outputs(batch, self._all_names))

    def run_outputs(self, batch: np.ndarray, names: list[str]) -> list[np.ndarray]:
        """Run and return the named outputs (float32), e.g. ["logits", "features"]."""
        return self._outputs(self.check_input(batch), names)

    def _outputs(self, batch: np.ndarray, names: list[str]) -> list[np.ndarray]:
        session = self._live_session()
        feed = batch if self._input_dtype is np.float32 else batch.astype(self._input_dtype)
        try:
            outs = session.run(list(names), {self.input_name: feed})
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise BackendError(
                f"{self.name}: ONNX Runtime failed to compute outputs {list(names)} (the model has "
                f"{self.output_names}) on a batch of shape {batch.shape}: {str(exc).strip()}"
            ) from exc
        return [np.asarray(o, dtype=np.float32) for o in outs]

    def close(self) -> None:
        self._session = None

    def describe(self) -> str:
        return f"onnxruntime {self._version} [{', '.join(self.providers)}]"


def verified_onnx_path(artifacts: Any, role: str) -> Path:
    """The verified ONNX file of ``role``, refused unless every external data file it loads is
    listed (and so sha256-verified) in the manifest entry of that role."""
    return artifacts.onnx_path(role)


def uses_ort_graph(artifacts: Any, options: BackendOptions | None) -> bool:
    """Whether "ort" runs model.ort.onnx: the manifest has it, every requested provider has its
    contrib kernels, and the caller did not ask for the standard graph (extra {"ort_graph": "standard"})."""
    options = options or BackendOptions()
    if options.extra.get("ort_graph", "auto") == "standard" or not artifacts.has("onnx-ort"):
        return False
    return all(_provider_name(p) in ORT_GRAPH_PROVIDERS for p in (options.providers or (CPU_PROVIDER,)))


def open_from_artifacts(
    artifacts: Any, options: BackendOptions | None = None, *, fp16: bool = False, int8: bool = False
) -> OrtBackend:
    """The "ort" backend (or "ort-fp16" with ``fp16=True``, "ort-int8" with ``int8=True``) on a verified artifact."""
    if fp16:
        role, name = "onnx-fp16", ORT_FP16
    elif int8:
        role, name = "onnx-int8", ORT_INT8
    else:
        role, name = ("onnx-ort" if uses_ort_graph(artifacts, options) else "onnx"), "ort"
    path = verified_onnx_path(artifacts, role)
    options = options or BackendOptions()
    requested = options.providers or (CPU_PROVIDER,)
    wants_trt_ep = any(_provider_name(p) == "TensorrtExecutionProvider" for p in requested)
    entries = provider_entries(
        requested,
        device=options.device,
        input_name=artifacts.input_name,
        chw=tuple(artifacts.input_shape),
        batch=artifacts.batch,
        fp16_graph=fp16,
        cache_dir=trt_ep_cache_dir(artifacts.directory) if wants_trt_ep else None,
    )
    options = dataclasses.replace(options, providers=tuple(entries))

    def io_check(inputs: Any, outputs: Any) -> None:
        check_graph_io(artifacts.schema, path, inputs, outputs, artifacts.manifest_path, fp16_io_ok=fp16)

    return OrtBackend(
        path,
        artifacts.input_shape,
        artifacts.batch["max"],
        options,
        name=name,
        external_data_checked=True,
        io_check=io_check,
        session_config=INT8_SESSION_CONFIG if int8 else (),
    )


def open_fp16_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> OrtBackend:
    return open_from_artifacts(artifacts, options, fp16=True)


def open_int8_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> OrtBackend:
    """ "ort-int8": model.int8.onnx, the INT8 graph quantized from model.ort.onnx (CPU kernels)."""
    return open_from_artifacts(artifacts, options, int8=True)
