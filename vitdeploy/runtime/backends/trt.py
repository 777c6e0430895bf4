"""The TensorRT backend ("trt"): runs model.engine, described by model.engine.json.

A serialized TensorRT engine only runs with the TensorRT version and on the GPU model it was
built for, so the backend reads model.engine.json first and refuses (ArtifactError) an engine
built elsewhere, telling the user to rebuild it with ``vitdeploy export`` on this machine.

Written against the name-based I/O API of TensorRT 10.x and 11.x (``num_io_tensors``,
``get_tensor_name``, ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``).
tensorrt and torch are imported lazily: torch supplies the CUDA device buffers and streams.
An execution context is not thread-safe, so each thread gets its own (``threading.local``).

model.engine.json (written by ``vitdeploy.export.tensorrt.build_engine``)::

    {"tensorrt_version": "10.13.3.9", "gpu_name": "NVIDIA H100 80GB HBM3",
     "compute_capability": "9.0", "profile": {"min": 1, "opt": 8, "max": 32},
     "input": "pixel_values", "chw": [3, 224, 224],
     "precision": "fp16 (strongly typed from the FP16 ONNX graph)", "onnx_sha256": "...",
     "workspace_mb": 4096, "optimization_level": 3, "built": "2025-01-01T00:00:00+00:00"}
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..._deps import require
from ...errors import ArtifactError, BackendError, ConfigError, MissingDependencyError
from ..cuda import cuda_index, cuda_status, gpu_identity
from .base import BackendBase, BackendOptions

log = logging.getLogger(__name__)

_UNKNOWN = "unknown"
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

    def describe_target(self) -> str:
        return f"TensorRT {self.tensorrt_version} on {self.gpu_name} (compute capability {self.compute_capability})"


@dataclass(frozen=True)
class MachineIdentity:
    """The facts of this machine an engine must match."""

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
    """ArtifactError unless ``meta`` was built with this TensorRT version on this GPU model."""
    pairs = [("tensorrt_version", meta.tensorrt_version, here.tensorrt_version),
             ("gpu_name", meta.gpu_name, here.gpu_name),
             ("compute_capability", meta.compute_capability, here.compute_capability)]
    differs = []
    for key, built, now in pairs:
        if built == _UNKNOWN:
            log.warning("%s.json does not record %s; cannot check the engine against this machine's %s", engine_path, key, now)
        elif built != now:
            differs.append(key)
    if differs:
        raise ArtifactError(
            f"{engine_path} was built for {meta.describe_target()}, but this machine has {here.describe()} "
            f"(differs in {', '.join(differs)}). A TensorRT engine only runs with the TensorRT version and GPU "
            "model it was built for: rebuild it with `vitdeploy export` on this machine "
            "(or use the 'ort' / 'ort-fp16' backend)."
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


def _torch_dtype(trt: Any, torch: Any, trt_dtype: Any, what: str) -> Any:
    pairs = [(trt.DataType.FLOAT, torch.float32), (trt.DataType.HALF, torch.float16), (trt.DataType.BF16, torch.bfloat16)]
    for candidate, torch_dtype in pairs:
        if trt_dtype == candidate:
            return torch_dtype
    raise ArtifactError(f"{what} has TensorRT dtype {trt_dtype}; the trt backend supports float32, float16 and bfloat16 I/O. Re-export the model with `vitdeploy export`")


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

    ``trt`` and ``probe`` exist for tests: a stand-in tensorrt module, and a callable
    ``probe(trt, device_index) -> MachineIdentity`` replacing the real version/GPU probe.
    """

    name = "trt"

    def __init__(self, engine_path: str | Path, meta_path: str | Path, input_shape: tuple[int, int, int],
                 max_batch: int | None = None, options: BackendOptions | None = None, *,
                 trt: Any = None, probe: Callable[[Any, int], MachineIdentity] | None = None) -> None:
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

        # 2. model.engine.json: was this engine built for this TensorRT and this GPU?
        meta = EngineMetadata.load(meta_path)
        here = (probe or probe_machine)(trt, self._device_index)
        check_engine_matches(meta, here, self.engine_path)
        self.meta = meta

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

        # 3. Deserialize.
        self._torch = require("torch", "the TensorRT backend's CUDA buffers")
        try:
            data = self.engine_path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"{self.engine_path} is missing; rebuild it with `vitdeploy export` on this machine") from None
        except OSError as exc:
            raise ArtifactError(f"cannot read {self.engine_path}: {exc}") from exc
        self._logger = make_trt_logger(trt)
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
        trt, torch = self._trt, self._torch
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
        self._input_dtype = _torch_dtype(trt, torch, engine.get_tensor_dtype(self._input_name), f"input '{self._input_name}'")
        self._output_dtypes = {n: _torch_dtype(trt, torch, engine.get_tensor_dtype(n), f"output '{n}'") for n in outputs}

    # -- per-thread execution state -----------------------------------------------------------

    def _thread_state(self) -> _ThreadState:
        if self._engine is None:
            raise BackendError("the trt backend is closed; open a new one")
        state = getattr(self._local, "state", None)
        if state is None:
            torch = self._torch
            with torch.cuda.device(self._device_index):
                context = self._engine.create_execution_context()
                if context is None:
                    raise BackendError(f"TensorRT could not create an execution context for {self.engine_path} "
                                       f"(out of GPU memory?){recent_errors(self._logger)}")
                state = _ThreadState(context, torch.cuda.Stream(device=self._device_index))
            self._local.state = state
            with self._lock:
                self._states.append(state)
        return state

    def _run(self, batch: np.ndarray) -> np.ndarray:
        torch = self._torch
        state = self._thread_state()
        ctx = state.context
        stream = state.stream
        device = torch.device("cuda", self._device_index)
        with torch.cuda.device(self._device_index), torch.cuda.stream(stream):
            x = torch.from_numpy(batch).to(device=device, dtype=self._input_dtype)
            if not ctx.set_input_shape(self._input_name, tuple(x.shape)):
                raise BackendError(f"TensorRT rejected input shape {tuple(x.shape)} for '{self._input_name}' "
                                   f"(engine profile batch {self.meta.profile['min']}..{self.meta.profile['max']}){recent_errors(self._logger)}")
            ctx.set_tensor_address(self._input_name, int(x.data_ptr()))
            buffers = {}
            for out_name in self._output_names:
                shape = tuple(int(d) for d in ctx.get_tensor_shape(out_name))
                if any(d < 0 for d in shape):
                    raise BackendError(f"TensorRT could not infer the shape of output '{out_name}' (got {shape})")
                buffers[out_name] = torch.empty(shape, dtype=self._output_dtypes[out_name], device=device)
                ctx.set_tensor_address(out_name, int(buffers[out_name].data_ptr()))
            if not ctx.execute_async_v3(stream.cuda_stream):
                raise BackendError(f"TensorRT execution failed for a batch of {batch.shape[0]}{recent_errors(self._logger)}")
            result = buffers[self._output_name].float().cpu()
        stream.synchronize()
        return result.numpy().astype(np.float32, copy=False)

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
    """Why the trt backend cannot run here (tensorrt missing, no CUDA GPU), or None."""
    try:
        require("tensorrt", "the TensorRT backend ('trt')")
    except MissingDependencyError as exc:
        return str(exc).splitlines()[0]
    device = (options or BackendOptions()).device
    ok, why = cuda_status("cuda:0" if device == "cpu" else device)
    return None if ok else f"no CUDA GPU: {why}"


def open_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> TrtBackend:
    """Open the engine of a verified artifact set.

    ``artifacts`` needs only: ``artifacts.path(role) -> Path`` for roles ``"engine"`` and
    ``"engine-meta"`` (already verified against the manifest's sha256), and
    ``artifacts.input_shape -> (C, H, W)``. The batch limit comes from model.engine.json.
    """
    return TrtBackend(artifacts.path("engine"), artifacts.path("engine-meta"), tuple(artifacts.input_shape),
                      None, options or BackendOptions())
