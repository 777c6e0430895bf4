"""The one interface every backend implements (Polygraphy-style runners).

A backend takes a float32 NCHW batch and returns float32 logits (``run``), or every output of the model
(``run_all``: an embedding and its patch tokens). Input checking and splitting a
batch larger than the artifact's max batch live here, once, so each backend only implements
``_run`` on a batch it is known to accept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ...base.errors import InputError


@dataclass(frozen=True)
class BackendOptions:
    """What pipeline.yaml's ``runtime`` section (or the caller) asks of a backend."""

    device: str = "cpu"  # "cpu" | "cuda" | "cuda:N"
    precision: str = "fp32"  # torch backend only: "fp32" | "fp16" (fp16 needs CUDA)
    # ONNX Runtime, in priority order: a name, or (name, {provider options}) as pipeline.yaml's [name, {...}]
    providers: tuple[Any, ...] = ("CPUExecutionProvider",)
    allow_cpu_fallback: bool = False  # ONNX Runtime: accept a session that fell back to CPU
    threads: int | None = None  # intra-op threads (CPU); None = the library's default
    #: ONNX Runtime: idle intra-op threads busy-wait (True), block (False), or "auto": spin only
    #: when the session's threads leave a core free
    ort_allow_spinning: bool | str = "auto"
    trt_contexts: int = 2  # TensorRT: execution contexts (each with GPU memory) shared by all threads
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"ort_graph": "standard"}

    @classmethod
    def from_runtime(cls, runtime: Any) -> "BackendOptions":
        """The options pipeline.yaml's ``runtime`` section (``config.RuntimeSection``) asks for."""
        return cls(
            device=runtime.device,
            providers=tuple(runtime.providers),
            allow_cpu_fallback=runtime.allow_cpu_fallback,
            threads=runtime.threads,
            ort_allow_spinning=runtime.ort_allow_spinning,
            trt_contexts=runtime.trt_contexts,
        )


def provider_name(entry: Any) -> str:
    """The provider name of an ONNX Runtime providers entry: "Name" or ("Name", {options})."""
    return str(entry[0]) if isinstance(entry, (tuple, list)) else str(entry)


@runtime_checkable
class Backend(Protocol):
    name: str
    max_batch: int | None

    def run(self, batch: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class BackendBase:
    """Shared input checks and transparent batch splitting; subclasses implement ``_run``."""

    name: str = "?"

    def __init__(self, input_shape: tuple[int, int, int], max_batch: int | None = None) -> None:
        self.input_shape = tuple(int(v) for v in input_shape)  # (C, H, W)
        self.max_batch = max_batch
        #: the square sides an export for several sizes answers at (manifest io.image_sizes); () = input_shape only
        self.image_sizes: tuple[int, ...] = ()

    def check_input(self, batch: Any) -> np.ndarray:
        if not isinstance(batch, np.ndarray):
            raise InputError(
                f"backend '{self.name}' expects a numpy float32 array of shape (N, "
                f"{', '.join(map(str, self.input_shape))}), got {type(batch).__name__}"
            )
        if batch.dtype != np.float32:
            raise InputError(
                f"backend '{self.name}' expects dtype float32, got {batch.dtype} (convert with "
                "batch.astype(np.float32))"
            )
        if batch.ndim == 4 and batch.shape[0] >= 1 and self._other_size(batch.shape[1:]):
            return np.ascontiguousarray(batch)
        if batch.ndim != 4 or tuple(batch.shape[1:]) != self.input_shape or batch.shape[0] < 1:
            if self.image_sizes:
                sizes = ", ".join(f"{s}x{s}" for s in self.image_sizes)
                raise InputError(
                    f"backend '{self.name}' expects (N, {self.input_shape[0]}, H, W) with H x W one of {sizes}, "
                    f"got {tuple(batch.shape)}"
                )
            expected = "(N, " + ", ".join(map(str, self.input_shape)) + ")"
            raise InputError(f"backend '{self.name}' expects shape {expected} with N >= 1, got {tuple(batch.shape)}")
        return np.ascontiguousarray(batch)

    def _other_size(self, chw: tuple[int, ...]) -> bool:
        """A listed size of an export for several sizes (square, the same channels)."""
        c, h, w = chw
        return c == self.input_shape[0] and h == w and h in self.image_sizes

    def run(self, batch: np.ndarray) -> np.ndarray:
        batch = self.check_input(batch)
        step = self.max_batch or batch.shape[0]
        if batch.shape[0] <= step:
            return self._run(batch)
        return np.concatenate([self._run(batch[i : i + step]) for i in range(0, batch.shape[0], step)])

    def _run(self, batch: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_all(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        """Every output of the model, float32, in the manifest's order: what :meth:`run` returns first, then an
        embedding's patch tokens (output.patch_tokens); checked and split by max batch as :meth:`run`."""
        batch = self.check_input(batch)
        step = self.max_batch or batch.shape[0]
        if batch.shape[0] <= step:
            return self._run_all(batch)
        parts = [self._run_all(batch[i : i + step]) for i in range(0, batch.shape[0], step)]
        return tuple(np.concatenate(column) for column in zip(*parts))

    def _run_all(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        """A backend whose model has more than one output overrides this."""
        return (self._run(batch),)

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return self.name

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
