"""Is a CUDA GPU usable here, and which one? Answered through torch when torch imports.

Nothing here imports torch at module import time. ``cuda_status`` never raises: it returns
``(ok, text)`` where ``text`` names the device when ``ok`` and says why not otherwise, in one
line, so callers can put it straight into a skip reason or an error message.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..base.errors import ConfigError, MissingDependencyError


@dataclass(frozen=True)
class GpuIdentity:
    """The facts a TensorRT engine is tied to: the device model and its compute capability."""

    index: int
    name: str
    compute_capability: str  # "9.0"

    def describe(self) -> str:
        return f"{self.name} (compute capability {self.compute_capability})"


def cuda_index(device: str | int | None) -> int:
    """The CUDA device index of ``"cuda"``, ``"cuda:N"``, ``N`` or None (index 0).

    ConfigError for anything else (``"cpu"``, ``"cuda:x"``, negative numbers).
    """
    if device is None:
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        index = device
    elif isinstance(device, str) and device.strip() == "cuda":
        return 0
    elif isinstance(device, str) and device.strip().startswith("cuda:") and device.strip()[5:].isdigit():
        index = int(device.strip()[5:])
    else:
        raise ConfigError(f"device {device!r} is not a CUDA device: expected 'cuda' or 'cuda:N' (N >= 0)")
    if index < 0:
        raise ConfigError(f"device index {index} is negative: expected 'cuda' or 'cuda:N' (N >= 0)")
    return index


def _torch():
    try:
        return importlib.import_module("torch"), ""
    except ImportError as exc:
        return None, f"torch is not installed, so CUDA cannot be probed (pip install torch==2.13.0): {exc}"


def cuda_status(device: str | int | None = None) -> tuple[bool, str]:
    """``(True, "cuda:0 NVIDIA H100 ... (compute capability 9.0)")`` or ``(False, reason)``."""
    try:
        index = cuda_index(device)
    except ConfigError as exc:
        return False, str(exc)
    torch, why = _torch()
    if torch is None:
        return False, why
    try:
        usable = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001 - a broken driver must read as "not usable", not crash
        return False, f"torch {torch.__version__} failed to initialise CUDA: {exc}".splitlines()[0]
    if not usable:
        built = getattr(torch.version, "cuda", None)
        if not built:
            return False, f"torch {torch.__version__} is a CPU-only build (install a CUDA build of torch)"
        return False, (
            f"torch {torch.__version__} (built for CUDA {built}) finds no usable CUDA device "
            "(no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides every GPU)"
        )
    count = int(torch.cuda.device_count())
    if index >= count:
        return False, f"cuda:{index} was requested but only {count} CUDA device(s) are visible"
    ident = _identity(torch, index)
    return True, f"cuda:{index} {ident.describe()}"


def _identity(torch, index: int) -> GpuIdentity:
    major, minor = torch.cuda.get_device_capability(index)
    return GpuIdentity(index=index, name=str(torch.cuda.get_device_name(index)), compute_capability=f"{major}.{minor}")


def gpu_identity(device: str | int | None = None) -> GpuIdentity:
    """The GPU at ``device`` (default cuda:0); MissingDependencyError when CUDA is not usable."""
    ok, why = cuda_status(device)
    if not ok:
        raise MissingDependencyError(f"no CUDA GPU: {why}")
    torch, _ = _torch()
    return _identity(torch, cuda_index(device))
