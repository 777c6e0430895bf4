"""The CUDA side of the trt backend: torch's devices, streams and buffers (:class:`TorchCuda`), and
the bounded pool of execution states (context, stream, activation memory) a run checks out.

Execution contexts are created with ``ExecutionContextAllocationStrategy.USER_MANAGED``: TensorRT's
default (``STATIC``) gives every context the activation memory of the profile's max batch for its
whole life, which a batch-1 server never uses. Here each run asks the context how much its shape
needs (``update_device_memory_size_for_shapes`` after ``set_input_shape``) and hands it that much
(``set_device_memory``), from a per-state buffer that grows to the largest shape the state has run.
A state whose run failed (a CUDA error, a refused call) is dropped, never handed to the next run.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Iterator

import numpy as np

from ....base._deps import require
from ....base.errors import BackendError

log = logging.getLogger("vitdeploy.runtime.backends.trt")


class TorchCuda:
    """The CUDA pieces the backend needs (current device, streams, device buffers), through torch.

    Kept behind this small interface so tests can substitute a fake that records calls.
    Buffers are torch tensors; ``dtype`` names are "float32" / "float16" / "bfloat16" / "uint8".
    Asynchronous CUDA failures surface as torch ``RuntimeError``s (at a copy or a synchronize);
    the backend turns them into BackendError.
    """

    def __init__(self) -> None:
        self._torch = require("torch", "the TensorRT backend's CUDA buffers")
        self.torch_version = str(self._torch.__version__)
        self.cuda_version = getattr(self._torch.version, "cuda", None)  # "13.0"; None for a CPU build

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
        return self._torch.from_numpy(batch).to(
            device=self._torch.device("cuda", index), dtype=getattr(self._torch, dtype)
        )

    def empty(self, shape: tuple[int, ...], dtype: str, index: int) -> Any:
        return self._torch.empty(shape, dtype=getattr(self._torch, dtype), device=self._torch.device("cuda", index))

    def scratch(self, nbytes: int, index: int) -> Any:
        """``nbytes`` of device memory for TensorRT's activations (torch's allocator aligns to 512 bytes)."""
        return self.empty((nbytes,), "uint8", index)

    def address(self, buffer: Any) -> int:
        return int(buffer.data_ptr())

    def download(self, buffer: Any, stream: Any) -> np.ndarray:
        """``buffer`` as a float32 host array, after ``stream`` has finished."""
        host = buffer.float().cpu()
        stream.synchronize()
        return host.numpy().astype(np.float32, copy=False)


class ExecState:
    """One execution context, the CUDA stream it runs on and its activation memory; one run at a time."""

    def __init__(self, context: Any, stream: Any) -> None:
        self.context = context
        self.stream = stream
        self.scratch: Any = None  # device buffer handed to set_device_memory (None until a shape needs one)
        self.scratch_bytes = 0

    def device_memory(self, cuda: Any, index: int, need: int) -> tuple[int, int]:
        """(address, size) of at least ``need`` bytes of activation memory, grown when a larger shape comes."""
        if need > self.scratch_bytes:
            self.scratch, self.scratch_bytes = None, 0  # free the smaller one before allocating
            self.scratch = cuda.scratch(need, index)
            self.scratch_bytes = need
        return (int(cuda.address(self.scratch)) if self.scratch is not None else 0), self.scratch_bytes


class ContextPool:
    """At most ``size`` execution states, checked out for one run and returned after it.

    The number alive is bounded however many threads call: a thread finding every state busy
    waits for one. A state whose run raised is dropped (its context may be in any state after a
    CUDA error) and a fresh one is created when needed.
    """

    def __init__(self, create: Callable[[], ExecState], size: int) -> None:
        self._create, self.size = create, size
        self._idle: list[ExecState] = []
        self.states: list[ExecState] = []  # every state alive (idle or checked out)
        self.dropped = 0  # states dropped after a failed run
        self._cond = threading.Condition()
        self._closed = False

    @contextlib.contextmanager
    def checkout(self) -> Iterator[ExecState]:
        with self._cond:
            while not self._closed and not self._idle and len(self.states) >= self.size:
                self._cond.wait()
            if self._closed:
                raise BackendError("the trt backend is closed; open a new one")
            if self._idle:
                state = self._idle.pop()
            else:
                state = self._create()
                self.states.append(state)
        failed = True
        try:
            yield state
            failed = False
        finally:
            with self._cond:
                if failed:
                    self.states = [s for s in self.states if s is not state]
                    self.dropped += 1
                    log.debug("trt backend: dropped an execution context after a failed run")
                elif not self._closed:
                    self._idle.append(state)
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._idle.clear()
            self.states.clear()
            self._cond.notify_all()
