"""Backend registry: a backend name to the module that implements it, imported on demand.

Importing this package imports no backend module, so neither torch, onnxruntime nor tensorrt
is loaded until a backend of that kind is opened.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ...base._deps import available
from ...base.errors import (
    ArtifactMismatchError,
    BackendError,
    ConfigError,
    MissingDependencyError,
    VitDeployError,
    first_line,
)
from ...base.vocab import (
    AUTO,
    BACKEND_KINDS,
    OPENVINO,
    OPENVINO_BF16,
    OPENVINO_INT8,
    ORT_FP16,
    ORT_INT8,
    RUNTIME_BACKENDS,
    TRT_INT8,
)
from ..cuda import cuda_status
from .base import Backend, BackendBase, BackendOptions

# The faults that mean "this backend cannot run here": the only ones backend "auto" skips past.
# A refused artifact (ArtifactIntegrityError, or any other ArtifactError: a broken schema, a path
# outside the folder, a file that contradicts the manifest) is final and stops every caller.
CANNOT_RUN_HERE: tuple[type[VitDeployError], ...] = (BackendError, MissingDependencyError, ArtifactMismatchError)

# name -> (module, opener function); the artifact roles and libraries each needs: vocab.BACKENDS
_OPENERS: dict[str, tuple[str, str]] = {
    "torch": ("torch_backend", "open_from_artifacts"),
    "ort": ("ort", "open_from_artifacts"),
    ORT_FP16: ("ort", "open_fp16_from_artifacts"),
    ORT_INT8: ("ort", "open_int8_from_artifacts"),
    "trt": ("trt", "open_from_artifacts"),
    TRT_INT8: ("trt", "open_int8_from_artifacts"),
    OPENVINO: ("openvino", "open_from_artifacts"),
    OPENVINO_INT8: ("openvino", "open_int8_from_artifacts"),
    OPENVINO_BF16: ("openvino", "open_bf16_from_artifacts"),
}
# name -> (module, opener function, artifact roles it needs (main one first), libraries it imports)
_REGISTRY: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    name: (module, func, BACKEND_KINDS[name].roles, BACKEND_KINDS[name].libraries)
    for name, (module, func) in _OPENERS.items()
}

__all__ = [
    "CANNOT_RUN_HERE",
    "Backend",
    "BackendBase",
    "BackendOptions",
    "Opened",
    "artifact_role",
    "artifact_roles",
    "backend_unavailable_reason",
    "cuda_device_count",
    "ensure_known",
    "first_line",
    "open_backend",
    "open_or_reason",
    "shipped_roles",
    "verify_backend_files",
]


def _check_name(name: str) -> None:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(RUNTIME_BACKENDS)} (or 'auto')")


def artifact_role(name: str) -> str:
    """The manifest artifact role a backend runs ("ort" -> "onnx", "trt" -> "engine", ...)."""
    _check_name(name)
    return _REGISTRY[name][2][0]


def artifact_roles(name: str) -> tuple[str, ...]:
    """Every manifest role backend ``name`` reads (torch: weights + model.json; trt: engine + metadata)."""
    _check_name(name)
    return _REGISTRY[name][2]


def shipped_roles(name: str, artifacts: Any) -> tuple[str, ...] | None:
    """The roles a copy of ``artifacts`` made for backend ``name`` must hold: every role it needs, then
    the optional roles it reads when present ("ort" runs model.ort.onnx when the manifest lists it).
    ``name`` "auto": None, meaning every listed role (auto may pick any backend)."""
    if name == AUTO:
        return None
    _check_name(name)
    kind = BACKEND_KINDS[name]
    return (*kind.roles, *(role for role in kind.optional_roles if artifacts.has(role)))


def verify_backend_files(name: str, artifacts: Any) -> dict[str, Any]:
    """Check the size and sha256 of every file backend ``name`` reads; {role: verified path}.

    ArtifactError for a missing role, or a missing, tampered or escaping file: such a file is an
    error, never a reason to skip a backend silently. Each role is hashed once per Artifacts.
    """
    return {role: artifacts.path(role) for role in artifact_roles(name)}


def _opener(name: str) -> Callable[..., Backend]:
    module_name, func, _, _ = _REGISTRY[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, func)


def open_backend(name: str, artifacts: Any, options: BackendOptions | None = None) -> Backend:
    """Open backend ``name`` on verified ``artifacts``.

    ConfigError for an unknown name; ArtifactError when its file is absent or tampered with;
    MissingDependencyError when its library is not installed; BackendError when it cannot run.
    """
    for role in artifact_roles(name):
        if not artifacts.has(role):
            artifacts.entry(role)  # raises ArtifactError naming the missing role and the fix
    backend = _opener(name)(artifacts, options or BackendOptions())
    backend.image_sizes = tuple(getattr(artifacts, "image_sizes", ()) or ())
    return backend


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
            return f"{dep} failed to import ({first_line(why)})"
    if name == "torch" and options.device.startswith("cuda"):
        ok, why = cuda_status(options.device)
        if not ok:
            return why
    if _REGISTRY[name][0] == "trt":  # trt, trt-int8
        try:
            module = importlib.import_module(f"{__name__}.trt")
        except ImportError as exc:
            return f"TensorRT backend unavailable ({first_line(exc)})"
        reason = module.unavailable_reason(artifacts, options)  # tensorrt, and a CUDA GPU through torch
        return str(reason) if reason else None
    if name == OPENVINO_BF16:  # BF16 math on this CPU, as OpenVINO's CPU device reports it
        from .openvino import bf16_refusal

        return bf16_refusal()
    return None


@dataclass(frozen=True)
class Opened:
    """What :func:`open_or_reason` found: the open backend, or why there is none.

    ``status``: "opened"; "unavailable" (cannot run here: no artifact role, library or GPU);
    "refused" (the caller's own ``refuse`` check said no); "error" (it failed to open, e.g. an
    engine built for another GPU). ``error`` is the error type raising it maps to:
    MissingDependencyError (exit 4) for "unavailable" and "refused", the type raised for "error".
    """

    name: str
    backend: Backend | None = None
    status: str = "opened"
    reason: str = ""  # one line; "" when opened
    error: type[VitDeployError] | None = None

    @property
    def ok(self) -> bool:
        return self.backend is not None


def open_or_reason(
    name: str, artifacts: Any, options: BackendOptions | None = None, *, refuse: Callable[[], str | None] | None = None
) -> Opened:
    """Open backend ``name`` on ``artifacts``, or say why not; the one way the Predictor's
    auto-selection, ``validate`` and ``bench`` open a backend.

    In order: the cheap checks of :func:`backend_unavailable_reason`; the caller's ``refuse()``
    (a reason, or None to go on); the size and sha256 of every file the backend reads; the open.
    Only :data:`CANNOT_RUN_HERE` faults give status "error"; a missing, tampered or escaping file,
    or any other ArtifactError, raises: a refusal is never a reason to skip a backend silently.
    ConfigError for an unknown name.
    """
    reason = backend_unavailable_reason(name, artifacts, options)
    if reason:
        return Opened(name, status="unavailable", reason=reason, error=MissingDependencyError)
    refused = refuse() if refuse is not None else None
    if refused:
        return Opened(name, status="refused", reason=refused, error=MissingDependencyError)
    verify_backend_files(name, artifacts)  # tampered or escaping files raise here, before any fallback
    try:
        backend = open_backend(name, artifacts, options)
    except CANNOT_RUN_HERE as exc:  # e.g. an engine built for another GPU, a CUDA provider that did not load
        return Opened(name, status="error", reason=first_line(exc), error=type(exc))
    return Opened(name, backend)  # any other error (a refused file, external data outside the folder) propagates


def ensure_known(name: str) -> str:
    """``name`` if it is a backend name or 'auto'; ConfigError otherwise."""
    if name != "auto":
        _check_name(name)
    return name
