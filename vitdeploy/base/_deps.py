"""Lazy imports of heavy optional dependencies, with one clear error when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError
from .vocab import tensorrt_install_command

_INSTALL_HINTS = {
    "torch": "pip install torch==2.13.0 (or vitdeploy[torch])",
    "safetensors": "pip install safetensors",
    "onnx": "pip install onnx",
    "onnxruntime": "pip install onnxruntime (CPU) or 'vitdeploy[gpu]'",
    "onnxscript": "pip install 'vitdeploy[export]'",
    "onnxconverter_common": "pip install 'vitdeploy[export]'",
    "tensorrt": f"driver R535+: {tensorrt_install_command(12)}; driver R580+: {tensorrt_install_command(13)}",
    "PIL": "pip install pillow",
    "tritonclient": "pip install 'tritonclient[grpc]'",
    "huggingface_hub": "pip install 'vitdeploy[export]' (huggingface_hub>=1.31)",
    "model_signing": "pip install 'vitdeploy[sign]'",
    "OpenSSL": "pip install 'vitdeploy[sign]'",
    "httpx": "pip install 'vitdeploy[client]'",
    "openvino": "pip install 'vitdeploy[openvino]'",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming ``purpose`` and the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised where the package is missing
        top = module.split(".")[0]
        hint = _INSTALL_HINTS.get(top, f"pip install {top}")
        raise MissingDependencyError(f"{purpose} needs {top}: {hint} ({exc})") from exc


def available(module: str) -> tuple[bool, str]:
    """(True, version) when ``module`` imports, else (False, the reason)."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means unavailable
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return True, str(getattr(mod, "__version__", "unknown"))
