"""The TensorRT backends: "trt" runs model.engine (FP16), described by model.engine.json;
"trt-int8" runs model.int8.engine (explicit INT8 from model.int8.trt.onnx), described by
model.int8.engine.json. Same code, another pair of files.

A serialized TensorRT engine only runs with the TensorRT version it was built with and on GPUs of
the compute capability it was built for, so the backend reads model.engine.json first and refuses
(ArtifactError) an engine built elsewhere, telling the user to rebuild it with ``vitdeploy export``
on this machine. A GPU of the same compute capability but another model name (H100 SXM vs PCIe)
is accepted with a warning (TensorRT itself warns that speed may suffer there).

Written against the name-based I/O API of TensorRT 10.x and 11.x (``num_io_tensors``,
``get_tensor_name``, ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``).
tensorrt and torch are imported lazily: torch supplies the CUDA device buffers and streams,
through the small ``TorchCuda`` object (trt_pool.py) (tests substitute a fake one); its CUDA major must be
TensorRT's. The engine is deserialized, and contexts/streams created, with the requested GPU
current. An execution context is not thread-safe, so a bounded pool of (context, stream,
activation memory) states serves every thread: a run checks one out and returns it, or drops it
when the run failed. Contexts are USER_MANAGED: each run hands its context the activation memory
its batch needs (``update_device_memory_size_for_shapes``), not the profile max's. A CUDA error
(raised by torch at a copy or synchronize) is a BackendError. A batch smaller than the engine
profile's min is padded (repeating its last row) up to min and the result sliced back. TensorRT keeps
one logger per process (:func:`trt_logger`); failures quote the errors it logged during that call.

model.engine.json (written by ``vitdeploy.export.tensorrt.build_engine``)::

    {"tensorrt_version": "10.13.3.9", "gpu_name": "NVIDIA H100 80GB HBM3",
     "compute_capability": "9.0", "profile": {"min": 1, "opt": 8, "max": 32},
     "input": "pixel_values", "chw": [3, 224, 224],
     "precision": "fp16 (strongly typed from the FP16 ONNX graph)", "onnx_sha256": "...",
     "workspace_mb": 4096, "optimization_level": 3, "built": "2025-01-01T00:00:00+00:00"}
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ....base._deps import require
from ....base.errors import ArtifactError, ArtifactMismatchError, BackendError, ConfigError
from ....base.vocab import OUTPUT_TENSORS, TRT_INT8, tensorrt_install_command
from ...cuda import cuda_index, cuda_status
from .. import first_line
from ..base import BackendBase, BackendOptions
from .log import (
    CANCEL,  # noqa: F401
    capture_errors,
    cuda_major_mismatch,
    quote_errors,
    start_tensorrt,  # noqa: F401
    tensorrt_cuda_major,
    trt_logger,  # noqa: F401
)
from .metadata import (
    EngineMetadata,
    MachineIdentity,
    check_engine_matches,
    check_engine_source,  # noqa: F401
    probe_machine,
)
from .pool import ContextPool, ExecState
from .pool import TorchCuda as _TorchCuda

log = logging.getLogger(__name__)

#: the output run() returns where an engine has several (a classifier's logits, an embedding's vectors)
FIRST_OUTPUTS = tuple(OUTPUT_TENSORS.values())
INSTALL_HINT = f"NVIDIA driver R535+: {tensorrt_install_command(12)}; driver R580+: {tensorrt_install_command(13)}"


# --------------------------------------------------------------------------------------------
# the backend


def _io_dtype(trt: Any, trt_dtype: Any, what: str) -> str:
    """ "float32" / "float16" / "bfloat16" for a TensorRT I/O dtype; ArtifactError for any other."""
    pairs = [(trt.DataType.FLOAT, "float32"), (trt.DataType.HALF, "float16"), (trt.DataType.BF16, "bfloat16")]
    for candidate, name in pairs:
        if trt_dtype == candidate:
            return name
    raise ArtifactError(
        f"{what} has TensorRT dtype {trt_dtype}; the trt backend supports float32, float16 and bfloat16 I/O. "
        "Re-export the model with `vitdeploy export`"
    )


class TrtBackend(BackendBase):
    """Runs a TensorRT engine on a CUDA GPU; float32 NCHW in, float32 logits out.

    ``engine_path`` / ``meta_path``: model.engine and model.engine.json. ``input_shape``: (C, H, W)
    the caller will feed. ``max_batch``: None uses the engine profile's max from the json; a larger
    value is a ConfigError (BackendBase splits bigger batches). ``options.device``: "cuda" or
    "cuda:N" ("cpu", the BackendOptions default, means cuda:0 here: TensorRT only runs on a GPU).

    ``onnx_sha256``: the sha256 of the ONNX graph the engine must have been built from (the
    manifest's onnx-fp16 entry); None skips that check. A batch smaller than the profile's min is
    padded up to min (repeating its last row) and the result sliced back.

    ``contexts``: at most this many execution contexts (each with its own stream) exist; a run
    checks one out and returns it, so a thread-per-request server never holds more GPU memory
    than that (default ``options.trt_contexts``).

    ``trt``, ``probe`` and ``cuda`` exist for tests: a stand-in tensorrt module, a callable
    ``probe(trt, device_index) -> MachineIdentity`` replacing the real version/GPU probe, and a
    stand-in for ``_TorchCuda`` (device, streams, buffers).
    """

    name = "trt"

    def __init__(
        self,
        engine_path: str | Path,
        meta_path: str | Path,
        input_shape: tuple[int, int, int],
        max_batch: int | None = None,
        options: BackendOptions | None = None,
        *,
        onnx_sha256: str | None = None,
        contexts: int | None = None,
        trt: Any = None,
        probe: Callable[[Any, int], MachineIdentity] | None = None,
        cuda: Any = None,
        name: str = "trt",
        onnx_role: str = "onnx-fp16",
    ) -> None:
        self.name = name
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
        check_engine_source(meta, onnx_sha256, self.engine_path, f"the manifest's {onnx_role} graph")
        here = (probe or probe_machine)(trt, self._device_index)
        check_engine_matches(meta, here, self.engine_path)
        self.meta = meta
        self._min_batch = int(meta.profile["min"])

        profile_max = int(meta.profile["max"])
        if max_batch is None:
            max_batch = profile_max
        elif isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= profile_max:
            raise ConfigError(
                f"max_batch={max_batch!r} for the trt backend: expected an integer in [1, {profile_max}] "
                f"(the engine's optimisation profile max in {meta_path}); rebuild with a larger batch.max to go beyond"
            )
        super().__init__(input_shape, max_batch)
        if tuple(meta.chw) != self.input_shape:
            raise ArtifactError(
                f"{meta_path} says the engine takes (N, {', '.join(map(str, meta.chw))}) but the "
                f"model expects (N, {', '.join(map(str, self.input_shape))}); rebuild the engine with `vitdeploy "
                "export`"
            )

        contexts = contexts if contexts is not None else options.trt_contexts
        if isinstance(contexts, bool) or not isinstance(contexts, int) or contexts < 1:
            raise ConfigError(
                f"trt_contexts={contexts!r}: expected an integer >= 1 (execution contexts kept for concurrent runs)"
            )

        # 3. Deserialize, on the requested GPU, with a torch of TensorRT's CUDA major.
        self._cuda = cuda if cuda is not None else _TorchCuda()
        mismatch = cuda_major_mismatch(
            tensorrt_cuda_major(), getattr(self._cuda, "cuda_version", None), getattr(self._cuda, "torch_version", "")
        )
        if mismatch:
            raise BackendError(mismatch)
        try:
            data = self.engine_path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(
                f"{self.engine_path} is missing; rebuild it with `vitdeploy export` on this machine"
            ) from None
        except OSError as exc:
            raise ArtifactError(f"cannot read {self.engine_path}: {exc}") from exc
        with self._cuda.device(self._device_index), capture_errors() as errors:
            self._runtime = start_tensorrt(trt, "Runtime", self._device_index, BackendError)
            self._engine = self._runtime.deserialize_cuda_engine(data)
        if self._engine is None:
            raise ArtifactMismatchError(
                f"TensorRT {here.tensorrt_version} could not deserialize {self.engine_path} "
                f"(corrupt, or built by another TensorRT){quote_errors(errors)}; "
                "rebuild it with `vitdeploy export` on this machine"
            )
        self._inspect_io()
        self._check_profile(meta_path)
        self._pool = ContextPool(self._new_state, contexts)
        log.info(
            "trt backend: %s (%s, batch %d..%d)",
            self.engine_path,
            here.describe(),
            meta.profile["min"],
            self.max_batch,
        )

    def _inspect_io(self) -> None:
        trt = self._trt
        engine = self._engine
        names = [str(engine.get_tensor_name(i)) for i in range(int(engine.num_io_tensors))]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if inputs != [self.meta.input]:
            raise ArtifactError(
                f"{self.engine_path} has input tensor(s) {inputs}, expected exactly ['{self.meta.input}'] "
                "as recorded in model.engine.json; rebuild it with `vitdeploy export`"
            )
        if not outputs:
            raise ArtifactError(f"{self.engine_path} has no output tensor; rebuild it with `vitdeploy export`")
        firsts = [n for n in FIRST_OUTPUTS if n in outputs]  # logits, or an embedding (beside its patch tokens)
        if firsts:
            self._output_name = firsts[0]
        elif len(outputs) == 1:
            self._output_name = outputs[0]
        else:
            raise ArtifactError(
                f"{self.engine_path} has outputs {outputs} and none is named {' or '.join(map(repr, FIRST_OUTPUTS))}; "
                "re-export the model with `vitdeploy export`"
            )
        self._input_name = inputs[0]
        # run_all's order: the first output, then the others (an embedding's patch tokens) as the engine lists them
        self._output_names = [self._output_name, *(n for n in outputs if n != self._output_name)]
        dims = [int(d) for d in engine.get_tensor_shape(self._input_name)]
        if len(dims) != 4 or tuple(dims[1:]) != self.input_shape:
            raise ArtifactError(
                f"{self.engine_path} input '{self._input_name}' has shape {tuple(dims)}, expected "
                f"(-1, {', '.join(map(str, self.input_shape))}); rebuild it with `vitdeploy export`"
            )
        self._input_dtype = _io_dtype(trt, engine.get_tensor_dtype(self._input_name), f"input '{self._input_name}'")
        self._output_dtypes = {n: _io_dtype(trt, engine.get_tensor_dtype(n), f"output '{n}'") for n in outputs}

    def _check_profile(self, meta_path: str | Path) -> None:
        """The engine's own optimisation profile must be the one model.engine.json describes."""
        shapes = self._engine.get_tensor_profile_shape(self._input_name, 0)
        dims = [tuple(int(d) for d in shape) for shape in shapes]
        want = [(self.meta.profile[k], *self.meta.chw) for k in ("min", "opt", "max")]
        if dims != want:
            got = "/".join(str(d) for d in dims)
            raise ArtifactError(
                f"{self.engine_path} has optimisation profile {got} (min/opt/max of input '{self._input_name}') "
                f"but {meta_path} says {'/'.join(str(d) for d in want)}; the engine and its json do not "
                "belong together: rebuild them with `vitdeploy export`"
            )

    # -- execution states (bounded pool) -------------------------------------------------------

    def _new_state(self) -> ExecState:
        strategy = self._trt.ExecutionContextAllocationStrategy.USER_MANAGED  # activation memory per run, see _run_on
        with self._cuda.device(self._device_index), capture_errors() as errors:
            context = self._engine.create_execution_context(strategy=strategy)
            if context is None:
                raise BackendError(
                    f"TensorRT could not create an execution context for {self.engine_path} "
                    f"(out of GPU memory?){quote_errors(errors)}"
                )
            return ExecState(context, self._cuda.new_stream(self._device_index))

    @property
    def live_contexts(self) -> int:
        """Execution contexts alive now (idle or running); never more than the pool size."""
        return len(self._pool.states)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        return self._run_all(batch, every=False)[0]

    def _run_all(self, batch: np.ndarray, every: bool = True) -> tuple[np.ndarray, ...]:
        """Every output (``every``), else the first alone, downloaded to the host."""
        if self._engine is None:
            raise BackendError("the trt backend is closed; open a new one")
        names = self._output_names if every else self._output_names[:1]
        with self._pool.checkout() as state:  # a failed run drops its state
            return self._run_on(state, batch, names)

    def _run_on(self, state: ExecState, batch: np.ndarray, names: list[str] | None = None) -> tuple[np.ndarray, ...]:
        """The outputs ``names`` (the first alone by default) of one run on ``state``."""
        names = names or self._output_names[:1]
        cuda, index = self._cuda, self._device_index
        count = int(batch.shape[0])
        if count < self._min_batch:  # the profile does not accept it: pad with copies of the last row
            batch = np.concatenate([batch, np.repeat(batch[-1:], self._min_batch - count, axis=0)])
        with cuda.device(index), cuda.use_stream(state.stream), capture_errors() as errors:
            try:
                result = self._enqueue(state, batch, errors, names)
            except RuntimeError as exc:  # torch's CUDA errors (an illegal address, out of memory) surface here
                raise BackendError(
                    f"CUDA failed while running {self.engine_path.name} on cuda:{index} for a batch of "
                    f"{batch.shape[0]}: {first_line(exc)}{quote_errors(errors)}; that execution context "
                    "was dropped. If every run fails now, the GPU context is broken: restart the process"
                ) from exc
        return tuple(out[:count] for out in result)

    def _enqueue(self, state: ExecState, batch: np.ndarray, errors: list[str], names: list[str]) -> list[np.ndarray]:
        """One run on ``state`` with its device and stream current: shape, activation memory, addresses,
        execute_async_v3 on the state's stream, then the outputs ``names`` back on the host."""
        cuda, index, ctx, stream = self._cuda, self._device_index, state.context, state.stream
        shape = tuple(int(d) for d in batch.shape)
        x = cuda.upload(batch, index, self._input_dtype)
        if not ctx.set_input_shape(self._input_name, shape):
            raise BackendError(
                f"TensorRT rejected input shape {shape} for '{self._input_name}' "
                f"(engine profile batch {self.meta.profile['min']}..{self.meta.profile['max']}){quote_errors(errors)}"
            )
        need = int(ctx.update_device_memory_size_for_shapes())  # 0 means an error, or a network without activations
        if need == 0 and errors:
            raise BackendError(
                f"TensorRT could not size the activation memory for input shape {shape}{quote_errors(errors)}"
            )
        ctx.set_device_memory(*state.device_memory(cuda, index, need))
        self._bind(ctx, self._input_name, cuda.address(x), errors)
        buffers = {}
        for out_name in self._output_names:
            out_shape = tuple(int(d) for d in ctx.get_tensor_shape(out_name))
            if any(d < 0 for d in out_shape):
                raise BackendError(f"TensorRT could not infer the shape of output '{out_name}' (got {out_shape})")
            buffers[out_name] = cuda.empty(out_shape, self._output_dtypes[out_name], index)
            self._bind(ctx, out_name, cuda.address(buffers[out_name]), errors)
        if not ctx.execute_async_v3(cuda.stream_handle(stream)):
            raise BackendError(f"TensorRT execution failed for a batch of {shape[0]}{quote_errors(errors)}")
        return [cuda.download(buffers[name], stream) for name in names]

    def _bind(self, ctx: Any, name: str, address: int, errors: list[str]) -> None:
        if not ctx.set_tensor_address(name, int(address)):
            raise BackendError(
                f"TensorRT refused the device address {int(address):#x} for tensor '{name}' (TensorRT wants "
                f"256-byte aligned device memory){quote_errors(errors)}"
            )

    def close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
        self._engine = None
        self._runtime = None

    def describe(self) -> str:
        m = self.meta
        return (
            f"trt ({self.engine_path.name}, TensorRT {m.tensorrt_version}, {m.gpu_name}, {m.precision}, "
            f"batch {m.profile['min']}..{self.max_batch})"
        )


# --------------------------------------------------------------------------------------------
# registry hooks


_RUNTIME_PROBES: dict[tuple[int, int], str | None] = {}  # (id(tensorrt module), device) -> reason or None


def _runtime_starts(trt: Any, index: int) -> str | None:
    """None when ``trt.Runtime`` can be created on cuda:``index`` (tried once per process), else why not."""
    key = (id(trt), index)
    if key not in _RUNTIME_PROBES:
        try:
            with _TorchCuda().device(index):
                start_tensorrt(trt, "Runtime", index, BackendError)
            _RUNTIME_PROBES[key] = None
        except Exception as exc:  # noqa: BLE001 - any failure to start means unusable
            _RUNTIME_PROBES[key] = first_line(exc)
    return _RUNTIME_PROBES[key]


def unavailable_reason(artifacts: Any = None, options: BackendOptions | None = None) -> str | None:
    """Why TensorRT cannot run here, or None; one line. Checks, in order: tensorrt imports, a CUDA
    GPU at the requested device (through torch), torch's CUDA major is TensorRT's, and a
    ``trt.Runtime`` starts there (created once per process and device, so auto-selection never
    picks a backend that cannot start).

    The one TensorRT availability check: the registry and the export pipeline both use it.
    """
    try:
        trt = importlib.import_module("tensorrt")
    except ModuleNotFoundError as exc:
        if exc.name == "tensorrt":
            return f"tensorrt is not installed ({INSTALL_HINT})"
        return f"tensorrt is installed but does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - e.g. libnvinfer missing: any failure means unusable
        return f"tensorrt is installed but does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    device = (options or BackendOptions()).device
    device = "cuda:0" if device == "cpu" else device
    ok, why = cuda_status(device)
    if not ok:
        return f"no CUDA GPU: {why}"
    torch = importlib.import_module("torch")  # cuda_status succeeded, so torch imports
    mismatch = cuda_major_mismatch(tensorrt_cuda_major(), getattr(torch.version, "cuda", None), str(torch.__version__))
    if mismatch:
        return mismatch
    return _runtime_starts(trt, cuda_index(device))


def open_from_artifacts(artifacts: Any, options: BackendOptions | None = None, *, int8: bool = False) -> TrtBackend:
    """Open the engine of a verified artifact set ("trt"; "trt-int8" with ``int8=True``).

    ``artifacts`` needs: ``artifacts.path(role) -> Path`` for roles ``"engine"`` and
    ``"engine-meta"`` (``"engine-int8"``, ``"engine-int8-meta"``), already verified against the
    manifest's sha256, and ``artifacts.input_shape -> (C, H, W)``. Where it also has ``has(role)``
    / ``entry(role)`` and the manifest lists the engine's source graph ("onnx-fp16";
    "onnx-int8-trt"), the engine must have been built from that graph (its sha256). The batch
    limit comes from the engine's json.
    """
    role, source, name = ("engine-int8", "onnx-int8-trt", TRT_INT8) if int8 else ("engine", "onnx-fp16", "trt")
    onnx_sha256 = None
    has = getattr(artifacts, "has", None)
    if callable(has) and has(source):
        onnx_sha256 = artifacts.entry(source).get("sha256") or None
    return TrtBackend(
        artifacts.path(role),
        artifacts.path(f"{role}-meta"),
        tuple(artifacts.input_shape),
        None,
        options or BackendOptions(),
        onnx_sha256=onnx_sha256,
        name=name,
        onnx_role=source,
    )


def open_int8_from_artifacts(artifacts: Any, options: BackendOptions | None = None) -> TrtBackend:
    """ "trt-int8": model.int8.engine, built from model.int8.trt.onnx."""
    return open_from_artifacts(artifacts, options, int8=True)
