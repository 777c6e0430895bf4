"""The TensorRT backend ("trt"): runs model.engine, described by model.engine.json.

A serialized TensorRT engine only runs with the TensorRT version it was built with and on GPUs of
the compute capability it was built for, so the backend reads model.engine.json first and refuses
(ArtifactError) an engine built elsewhere, telling the user to rebuild it with ``vitdeploy export``
on this machine. A GPU of the same compute capability but another model name (H100 SXM vs PCIe)
is accepted with a warning (TensorRT itself warns that speed may suffer there).

Written against the name-based I/O API of TensorRT 10.x and 11.x (``num_io_tensors``,
``get_tensor_name``, ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``).
tensorrt and torch are imported lazily: torch supplies the CUDA device buffers and streams,
through the small ``_TorchCuda`` object (tests substitute a fake one). The engine is deserialized,
and contexts/streams created, with the requested GPU current. An execution context is not
thread-safe, so each thread gets its own (``threading.local``). A batch smaller than the engine
profile's min is padded (repeating its last row) up to min and the result sliced back.

model.engine.json (written by ``vitdeploy.export.tensorrt.build_engine``)::

    {"tensorrt_version": "10.13.3.9", "gpu_name": "NVIDIA H100 80GB HBM3",
     "compute_capability": "9.0", "profile": {"min": 1, "opt": 8, "max": 32},
     "input": "pixel_values", "chw": [3, 224, 224],
     "precision": "fp16 (strongly typed from the FP16 ONNX graph)", "onnx_sha256": "...",
     "workspace_mb": 4096, "optimization_level": 3, "built": "2025-01-01T00:00:00+00:00"}
"""

from __future__ import annotations

import collections
import importlib
import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..._deps import require
from ...errors import ArtifactError, BackendError, ConfigError
from ..cuda import cuda_index, cuda_status, gpu_identity
from .base import BackendBase, BackendOptions

log = logging.getLogger(__name__)

_UNKNOWN = "unknown"
INSTALL_HINT = "pip install 'vitdeploy[tensorrt]'"
# nvinfer1::ILogger::Severity values: kINTERNAL_ERROR=0, kERROR=1, kWARNING=2, kINFO=3, kVERBOSE=4.
_SEVERITY_LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.DEBUG, 4: 5}


# --------------------------------------------------------------------------------------------
# model.engine.json


@dataclass(frozen=True)
class EngineMetadata:
    """Contents of model.engine.json: what the engine was built from, with what, and where."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    profile: dict[str, int]  # {"min", "opt", "max"} batch sizes of the optimisation profile
    input: str
    chw: tuple[int, int, int]
    precision: str
    onnx_sha256: str
    workspace_mb: int
    optimization_level: int
    built: str  # ISO 8601

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["chw"] = list(self.chw)
        data["profile"] = {k: int(self.profile[k]) for k in ("min", "opt", "max")}
        return data

    @classmethod
    def from_dict(cls, data: Any, source: str = "model.engine.json") -> "EngineMetadata":
        """Parse and check ``data``; ArtifactError naming ``source`` and the key otherwise."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{source}: expected a JSON object, got {type(data).__name__}; rebuild the engine with `vitdeploy export`")
        missing = [f for f in cls.__dataclass_fields__ if f not in data]
        if missing:
            raise ArtifactError(f"{source}: missing key(s) {missing}; it was not written by this vitdeploy version: rebuild the engine with `vitdeploy export`")

        def bad(key: str, expected: str) -> ArtifactError:
            return ArtifactError(f"{source}: key '{key}' must be {expected}, got {data[key]!r}; rebuild the engine with `vitdeploy export`")

        for key in ("tensorrt_version", "gpu_name", "compute_capability", "input", "precision", "onnx_sha256", "built"):
            if not isinstance(data[key], str) or not data[key]:
                raise bad(key, "a non-empty string")
        for key in ("workspace_mb", "optimization_level"):
            if not isinstance(data[key], int) or isinstance(data[key], bool):
                raise bad(key, "an integer")
        chw = data["chw"]
        if not isinstance(chw, list) or len(chw) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in chw):
            raise bad("chw", "a list of 3 positive integers [C, H, W]")
        batches = data["profile"]
        if not isinstance(batches, dict) or set(batches) != {"min", "opt", "max"} or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in batches.values()
        ):
            raise bad("profile", 'an object {"min": int, "opt": int, "max": int}')
        if not 1 <= batches["min"] <= batches["opt"] <= batches["max"]:
            raise bad("profile", "batch sizes with 1 <= min <= opt <= max")
        values = {k: data[k] for k in cls.__dataclass_fields__}
        values["chw"] = tuple(chw)
        values["profile"] = dict(batches)
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> "EngineMetadata":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ArtifactError(f"{path} is missing: the TensorRT engine cannot be checked against this machine without it; rebuild the engine with `vitdeploy export`") from None
        except OSError as exc:
            raise ArtifactError(f"cannot read {path}: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{path} is not valid JSON ({exc}); rebuild the engine with `vitdeploy export`") from exc
        return cls.from_dict(data, source=str(path))

    @property
    def target(self) -> MachineIdentity:
        """The TensorRT version and GPU the engine was built for."""
        return MachineIdentity(self.tensorrt_version, self.gpu_name, self.compute_capability)


@dataclass(frozen=True)
class MachineIdentity:
    """The facts of a machine an engine must match (this one, or the one it was built on)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str

    def describe(self) -> str:
        return f"TensorRT {self.tensorrt_version} on {self.gpu_name} (compute capability {self.compute_capability})"


def probe_machine(trt: Any, device: str | int | None = None) -> MachineIdentity:
    """TensorRT version (``trt.__version__``) and the GPU at ``device``; MissingDependencyError without CUDA."""
    gpu = gpu_identity(device)
    return MachineIdentity(str(trt.__version__), gpu.name, gpu.compute_capability)


def check_engine_matches(meta: EngineMetadata, here: MachineIdentity, engine_path: str | Path) -> None:
    """ArtifactError unless ``meta`` was built with this TensorRT version for this compute capability.

    The TensorRT version must match exactly (engines are not portable across versions) and so must
    the compute capability; a different GPU model name with the same compute capability (e.g.
    H100 SXM vs H100 PCIe) is accepted with a warning.
    """
    built = meta.target
    differs = []
    for key in ("tensorrt_version", "compute_capability"):
        then, now = getattr(built, key), getattr(here, key)
        if then == _UNKNOWN:
            log.warning("%s.json does not record %s; cannot check the engine against this machine's %s", engine_path, key, now)
        elif then != now:
            differs.append(key)
    if differs:
        raise ArtifactError(
            f"{engine_path} was built for {built.describe()}, but this machine has {here.describe()} "
            f"(differs in {', '.join(differs)}). A TensorRT engine only runs with the TensorRT version and GPU "
            "compute capability it was built for: rebuild it with `vitdeploy export` on this machine "
            "(or use the 'ort' / 'ort-fp16' backend)."
        )
    if built.gpu_name not in (_UNKNOWN, here.gpu_name):
        log.warning("%s was built on %s and runs here on %s (same compute capability %s): TensorRT accepts it but it "
                    "may run slower than an engine built here; rebuild with `vitdeploy export` on this machine for best speed",
                    engine_path, built.gpu_name, here.gpu_name, here.compute_capability)


def check_engine_source(meta: EngineMetadata, onnx_sha256: str | None, engine_path: str | Path, onnx_what: str) -> None:
    """ArtifactError unless the engine was built from the ONNX graph with sha256 ``onnx_sha256``.

    ``onnx_sha256`` None (not known, e.g. no manifest yet) skips the check.
    """
    if not onnx_sha256:
        return
    if meta.onnx_sha256 == _UNKNOWN:
        log.warning("%s.json does not record the ONNX graph it was built from; cannot check it against %s", engine_path, onnx_what)
        return
    if meta.onnx_sha256.lower() != str(onnx_sha256).lower():
        raise ArtifactError(
            f"{engine_path} was built from an ONNX graph with sha256 {meta.onnx_sha256} (its .json), but {onnx_what} "
            f"has sha256 {onnx_sha256}: the engine was built from another graph and would not compute this model. "
            "Rebuild it with `vitdeploy export` (or use the 'ort' / 'ort-fp16' backend)."
        )


# --------------------------------------------------------------------------------------------
# TensorRT logging -> Python logging


def make_trt_logger(trt: Any, logger: logging.Logger | None = None) -> Any:
    """A ``trt.ILogger`` that forwards TensorRT's messages to Python ``logging``.

    It keeps the latest error messages in ``.errors`` so a failure can quote them.
    """
    target = logger or log

    class _LoggingBridge(trt.ILogger):
        def __init__(self) -> None:
            super().__init__()
            self.errors: collections.deque[str] = collections.deque(maxlen=20)

        def log(self, severity: Any, msg: str) -> None:
            level = _SEVERITY_LEVELS.get(int(severity), logging.DEBUG)
            if level >= logging.ERROR:
                self.errors.append(str(msg))
            if target.isEnabledFor(level):
                target.log(level, "TensorRT: %s", msg)

    return _LoggingBridge()


def recent_errors(trt_logger: Any) -> str:
    """The errors a ``make_trt_logger`` logger saw, as one line ('' for other loggers)."""
    errors = list(getattr(trt_logger, "errors", ()) or ())
    return ("; TensorRT said: " + " | ".join(errors[-5:])) if errors else ""


# --------------------------------------------------------------------------------------------
# the backend


def _io_dtype(trt: Any, trt_dtype: Any, what: str) -> str:
    """"float32" / "float16" / "bfloat16" for a TensorRT I/O dtype; ArtifactError for any other."""
    pairs = [(trt.DataType.FLOAT, "float32"), (trt.DataType.HALF, "float16"), (trt.DataType.BF16, "bfloat16")]
    for candidate, name in pairs:
        if trt_dtype == candidate:
            return name
    raise ArtifactError(f"{what} has TensorRT dtype {trt_dtype}; the trt backend supports float32, float16 and bfloat16 I/O. Re-export the model with `vitdeploy export`")


class _TorchCuda:
    """The CUDA pieces the backend needs (current device, streams, device buffers), through torch.

    Kept behind this small interface so tests can substitute a fake that records calls.
    Buffers are torch tensors; ``dtype`` names are "float32" / "float16" / "bfloat16".
    """

    def __init__(self) -> None:
        self._torch = require("torch", "the TensorRT backend's CUDA buffers")

    def device(self, index: int) -> Any:
        """Context manager making cuda:``index`` the current device."""
        return self._torch.cuda.device(index)

    def new_stream(self, index: int) -> Any:
        return self._torch.cuda.Stream(device=index)

    def use_stream(self, stream: Any) -> Any:
        """Context manager making ``stream`` the current stream (copies and allocations go there)."""
        return self._torch.cuda.stream(stream)

    def stream_handle(self, stream: Any) -> int:
        return int(stream.cuda_stream)

    def upload(self, batch: np.ndarray, index: int, dtype: str) -> Any:
        return self._torch.from_numpy(batch).to(device=self._torch.device("cuda", index), dtype=getattr(self._torch, dtype))

    def empty(self, shape: tuple[int, ...], dtype: str, index: int) -> Any:
        return self._torch.empty(shape, dtype=getattr(self._torch, dtype), device=self._torch.device("cuda", index))

    def address(self, buffer: Any) -> int:
        return int(buffer.data_ptr())

    def download(self, buffer: Any, stream: Any) -> np.ndarray:
        """``buffer`` as a float32 host array, after ``stream`` has finished."""
        host = buffer.float().cpu()
        stream.synchronize()
        return host.numpy().astype(np.float32, copy=False)


class _ThreadState:
    """One execution context and one CUDA stream, owned by one thread."""

    def __init__(self, context: Any, stream: Any) -> None:
        self.context = context
        self.stream = stream


class TrtBackend(BackendBase):
    """Runs a TensorRT engine on a CUDA GPU; float32 NCHW in, float32 logits out.

    ``engine_path`` / ``meta_path``: model.engine and model.engine.json. ``input_shape``: (C, H, W)
    the caller will feed. ``max_batch``: None uses the engine profile's max from the json; a larger
    value is a ConfigError (BackendBase splits bigger batches). ``options.device``: "cuda" or
    "cuda:N" ("cpu", the BackendOptions default, means cuda:0 here: TensorRT only runs on a GPU).

    ``onnx_sha256``: the sha256 of the ONNX graph the engine must have been built from (the
    manifest's onnx-fp16 entry); None skips that check. A batch smaller than the profile's min is
    padded up to min (repeating its last row) and the result sliced back.

    ``trt``, ``probe`` and ``cuda`` exist for tests: a stand-in tensorrt module, a callable
    ``probe(trt, device_index) -> MachineIdentity`` replacing the real version/GPU probe, and a
    stand-in for ``_TorchCuda`` (device, streams, buffers).
    """

    name = "trt"

    def __init__(self, engine_path: str | Path, meta_path: str | Path, input_shape: tuple[int, int, int],
                 max_batch: int | None = None, options: BackendOptions | None = None, *, onnx_sha256: str | None = None,
                 trt: Any = None, probe: Callable[[Any, int], MachineIdentity] | None = None, cuda: Any = None) -> None:
        # 1. TensorRT itself, before anything else.
        trt = trt if trt is not None else require("tensorrt", "the TensorRT backend ('trt')")
        self._trt = trt
        options = options or BackendOptions()
        device = options.device
        if device == "cpu":
            log.debug("trt backend: device 'cpu' requested; TensorRT runs on cuda:0")
            device = "cuda:0"
        self._device_index = cuda_index(device)
        self.engine_path = Path(engine_path)

        # 2. model.engine.json: was this engine built from this graph, for this TensorRT and this GPU?
        meta = EngineMetadata.load(meta_path)
        check_engine_source(meta, onnx_sha256, self.engine_path, "the manifest's onnx-fp16 graph")
        here = (probe or probe_machine)(trt, self._device_index)
        check_engine_matches(meta, here, self.engine_path)
        self.meta = meta
        self._min_batch = int(meta.profile["min"])

        profile_max = int(meta.profile["max"])
        if max_batch is None:
            max_batch = profile_max
        elif isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= profile_max:
            raise ConfigError(f"max_batch={max_batch!r} for the trt backend: expected an integer in [1, {profile_max}] "
                              f"(the engine's optimisation profile max in {meta_path}); rebuild with a larger batch.max to go beyond")
        super().__init__(input_shape, max_batch)
        if tuple(meta.chw) != self.input_shape:
            raise ArtifactError(f"{meta_path} says the engine takes (N, {', '.join(map(str, meta.chw))}) but the "
                                f"model expects (N, {', '.join(map(str, self.input_shape))}); rebuild the engine with `vitdeploy export`")

        # 3. Deserialize, on the requested GPU.
        self._cuda = cuda if cuda is not None else _TorchCuda()
        try:
            data = self.engine_path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"{self.engine_path} is missing; rebuild it with `vitdeploy export` on this machine") from None
        except OSError as exc:
            raise ArtifactError(f"cannot read {self.engine_path}: {exc}") from exc
        self._logger = make_trt_logger(trt)
        with self._cuda.device(self._device_index):
            self._runtime = trt.Runtime(self._logger)
            self._engine = self._runtime.deserialize_cuda_engine(data)
        if self._engine is None:
            raise ArtifactError(f"TensorRT {here.tensorrt_version} could not deserialize {self.engine_path} "
                                f"(corrupt, or built by another TensorRT){recent_errors(self._logger)}; "
                                "rebuild it with `vitdeploy export` on this machine")
        self._inspect_io()
        self._local = threading.local()
        self._states: list[_ThreadState] = []
        self._lock = threading.Lock()
        log.info("trt backend: %s (%s, batch %d..%d)", self.engine_path, here.describe(), meta.profile["min"], self.max_batch)

    def _inspect_io(self) -> None:
        trt = self._trt
        engine = self._engine
        names = [str(engine.get_tensor_name(i)) for i in range(int(engine.num_io_tensors))]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if inputs != [self.meta.input]:
            raise ArtifactError(f"{self.engine_path} has input tensor(s) {inputs}, expected exactly ['{self.meta.input}'] "
                                "as recorded in model.engine.json; rebuild it with `vitdeploy export`")
        if not outputs:
            raise ArtifactError(f"{self.engine_path} has no output tensor; rebuild it with `vitdeploy export`")
        if "logits" in outputs:
            self._output_name = "logits"
        elif len(outputs) == 1:
            self._output_name = outputs[0]
        else:
            raise ArtifactError(f"{self.engine_path} has outputs {outputs} and none is named 'logits'; re-export the model with `vitdeploy export`")
        self._input_name = inputs[0]
        self._output_names = outputs
        dims = [int(d) for d in engine.get_tensor_shape(self._input_name)]
        if len(dims) != 4 or tuple(dims[1:]) != self.input_shape:
            raise ArtifactError(f"{self.engine_path} input '{self._input_name}' has shape {tuple(dims)}, expected "
                                f"(-1, {', '.join(map(str, self.input_shape))}); rebuild it with `vitdeploy export`")
        self._input_dtype = _io_dtype(trt, engine.get_tensor_dtype(self._input_name), f"input '{self._input_name}'")
        self._output_dtypes = {n: _io_dtype(trt, engine.get_tensor_dtype(n), f"output '{n}'") for n in outputs}

    # -- per-thread execution state -----------------------------------------------------------

    def _thread_state(self) -> _ThreadState:
        if self._engine is None:
            raise BackendError("the trt backend is closed; open a new one")
        state = getattr(self._local, "state", None)
        if state is None:
            with self._cuda.device(self._device_index):
                context = self._engine.create_execution_context()
                if context is None:
                    raise BackendError(f"TensorRT could not create an execution context for {self.engine_path} "
                                       f"(out of GPU memory?){recent_errors(self._logger)}")
                state = _ThreadState(context, self._cuda.new_stream(self._device_index))
            self._local.state = state
            with self._lock:
                self._states.append(state)
        return state

    def _run(self, batch: np.ndarray) -> np.ndarray:
        cuda, index = self._cuda, self._device_index
        state = self._thread_state()
        ctx = state.context
        stream = state.stream
        count = int(batch.shape[0])
        if count < self._min_batch:  # the profile does not accept it: pad with copies of the last row
            batch = np.concatenate([batch, np.repeat(batch[-1:], self._min_batch - count, axis=0)])
        shape = tuple(int(d) for d in batch.shape)
        with cuda.device(index), cuda.use_stream(stream):
            x = cuda.upload(batch, index, self._input_dtype)
            if not ctx.set_input_shape(self._input_name, shape):
                raise BackendError(f"TensorRT rejected input shape {shape} for '{self._input_name}' "
                                   f"(engine profile batch {self.meta.profile['min']}..{self.meta.profile['max']}){recent_errors(self._logger)}")
            ctx.set_tensor_address(self._input_name, cuda.address(x))
            buffers = {}
            for out_name in self._output_names:
                out_shape = tuple(int(d) for d in ctx.get_tensor_shape(out_name))
                if any(d < 0 for d in out_shape):
                    raise BackendError(f"TensorRT could not infer the shape of output '{out_name}' (got {out_shape})")
                buffers[out_name] = cuda.empty(out_shape, self._output_dtypes[out_name], index)
                ctx.set_tensor_address(out_name, cuda.address(buffers[out_name]))
            if not ctx.execute_async_v3(cuda.stream_handle(stream)):
                raise BackendError(f"TensorRT execution failed for a batch of {shape[0]}{recent_errors(self._logger)}")
            result = cuda.download(buffers[self._output_name], stream)
        return result[:count]

    def close(self) -> None:
        with self._lock:
            self._states.clear()
        self._local = threading.local()
        self._engine = None
        self._runtime = None

    def describe(self) -> str:
        m = self.meta
        return (f"trt ({self.engine_path.name}, TensorRT {m.tensorrt_version}, {m.gpu_name}, {m.precision}, "
                f"batch {m.profile['min']}..{self.max_batch})")


# --------------------------------------------------------------------------------------------
# registry hooks


def unavailable_reason(artifacts: Any = None, options: BackendOptions | None = None) -> str | None:
    """Why TensorRT cannot run here (tensorrt missing or broken, no CUDA GPU), or None; one line.

    The one TensorRT availability check: the registry and the export pipeline both use it.
    """
    try:
        importlib.import_module("tensorrt")
    except ModuleNotFoundError as exc:
        if exc.name == "tensorrt":
            return f"tensorrt is not installed ({INSTALL_HINT})"
        return f"tensorrt is installed but does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - e.g. libnvinfer missing: any failure means unusable
        return f"tensorrt is installed but does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    device = (options or BackendOptions()).device
    ok, why = cuda_status("cuda:0" if device == "cpu" else device)
    return None if ok else f"no CUDA GPU: {why}"


def open_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> TrtBackend:
    """Open the engine of a verified artifact set.

    ``artifacts`` needs: ``artifacts.path(role) -> Path`` for roles ``"engine"`` and
    ``"engine-meta"`` (already verified against the manifest's sha256), and
    ``artifacts.input_shape -> (C, H, W)``. Where it also has ``has(role)`` / ``entry(role)`` and
    the manifest lists "onnx-fp16", the engine must have been built from that graph (its sha256).
    The batch limit comes from model.engine.json.
    """
    onnx_sha256 = None
    has = getattr(artifacts, "has", None)
    if callable(has) and has("onnx-fp16"):
        onnx_sha256 = artifacts.entry("onnx-fp16").get("sha256") or None
    return TrtBackend(artifacts.path("engine"), artifacts.path("engine-meta"), tuple(artifacts.input_shape),
                      None, options or BackendOptions(), onnx_sha256=onnx_sha256)
