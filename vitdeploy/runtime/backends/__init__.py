"""Backend registry: a backend name to the module that implements it, imported on demand.

Importing this package imports no backend module, so neither torch, onnxruntime nor tensorrt
is loaded until a backend of that kind is opened.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
from typing import Any, Callable

from ..._deps import available
from ...errors import ConfigError
from .base import Backend, BackendBase, BackendOptions

BACKEND_NAMES = ("torch", "ort", "ort-fp16", "trt")

# name -> (module, opener function, artifact roles it needs (main one first), libraries it imports)
_REGISTRY: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    "torch": ("torch_backend", "open_from_artifacts", ("weights",), ("torch", "safetensors")),
    "ort": ("ort", "open_from_artifacts", ("onnx",), ("onnxruntime",)),
    "ort-fp16": ("ort", "open_fp16_from_artifacts", ("onnx-fp16",), ("onnxruntime",)),
    "trt": ("trt", "open_from_artifacts", ("engine", "engine-meta"), ("tensorrt",)),
}

__all__ = ["BACKEND_NAMES", "Backend", "BackendBase", "BackendOptions", "artifact_role", "artifact_roles",
           "backend_unavailable_reason", "cuda_device_count", "ensure_known", "open_backend"]


def _check_name(name: str) -> None:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)} (or 'auto')")


def artifact_role(name: str) -> str:
    """The manifest artifact role a backend runs ("ort" -> "onnx", "trt" -> "engine", ...)."""
    _check_name(name)
    return _REGISTRY[name][2][0]


def artifact_roles(name: str) -> tuple[str, ...]:
    """Every manifest role backend ``name`` reads (trt: the engine and its metadata)."""
    _check_name(name)
    return _REGISTRY[name][2]


def _opener(name: str) -> Callable[..., Backend]:
    module_name, func, _, _ = _REGISTRY[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, func)


def open_backend(name: str, artifacts: Any, options: BackendOptions | None = None) -> Backend:
    """Open backend ``name`` on verified ``artifacts``.

    ConfigError for an unknown name; ArtifactError when its file is absent or tampered with;
    MissingDependencyError when its library is not installed; BackendError when it cannot run.
    """
    _check_name(name)
    for role in _REGISTRY[name][2]:
        if not artifacts.has(role):
            artifacts.entry(role)  # raises ArtifactError naming the missing role and the fix
    return _opener(name)(artifacts, options or BackendOptions())


@functools.lru_cache(maxsize=1)
def cuda_device_count() -> int:
    """CUDA GPUs visible through the driver API (libcuda), without importing torch or CUDA Python."""
    candidates = [ctypes.util.find_library("cuda"), "libcuda.so.1", "libcuda.so", "nvcuda.dll"]
    for lib in filter(None, candidates):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return int(count.value)
    return 0


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def backend_unavailable_reason(name: str, artifacts: Any = None, options: BackendOptions | None = None) -> str | None:
    """Why backend ``name`` cannot be opened here, or None when it should open.

    Checks cheap facts only (no file hashing, no session): the artifact role is in the manifest
    (when ``artifacts`` is given), the library imports, a CUDA GPU exists where one is required.
    Used by auto-selection and by ``vitdeploy info`` / ``validate``.
    """
    _check_name(name)
    options = options or BackendOptions()
    _, _, roles, deps = _REGISTRY[name]
    for role in roles if artifacts is not None else ():
        if not artifacts.has(role):
            return f"manifest has no '{role}' artifact"
    for dep in deps:
        ok, why = available(dep)
        if not ok:
            if why.startswith("ModuleNotFoundError"):
                return f"{dep} not installed"
            return f"{dep} failed to import ({_first_line(why)})"
    if name == "torch" and options.device.startswith("cuda"):
        ok, why = _torch_cuda()
        if not ok:
            return why
    if name == "trt":
        try:
            module = importlib.import_module(f"{__name__}.trt")
        except ImportError as exc:
            return f"TensorRT backend unavailable ({exc})"
        probe = getattr(module, "unavailable_reason", None)
        if callable(probe):  # the backend's own check (tensorrt, CUDA device through torch)
            reason = probe(artifacts, options)
            return str(reason) if reason else None
        if cuda_device_count() == 0:
            return "no CUDA GPU (TensorRT needs one)"
    return None


def _torch_cuda() -> tuple[bool, str]:
    try:
        import torch  # noqa: PLC0415 - only reached when torch is already known to import
    except ImportError as exc:  # pragma: no cover
        return False, f"torch not installed ({exc})"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA GPU"
    return True, ""


def ensure_known(name: str) -> str:
    """``name`` if it is a backend name or 'auto'; ConfigError otherwise."""
    if name != "auto":
        _check_name(name)
    return name
