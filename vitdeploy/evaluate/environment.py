"""`vitdeploy info`: what this machine can run, and why not where not."""

from __future__ import annotations

import platform
from typing import Iterator

from .. import __version__
from .._deps import available


def environment_report() -> Iterator[str]:
    yield f"vitdeploy {__version__} on Python {platform.python_version()} ({platform.system()} {platform.machine()})"
    yield "libraries:"
    for module in ("torch", "onnx", "onnxruntime", "tensorrt", "numpy", "PIL"):
        ok, detail = available(module)
        yield f"  {module:<12} {detail if ok else 'missing: ' + detail}"
    ok, _ = available("onnxruntime")
    if ok:
        import onnxruntime

        yield f"onnxruntime providers: {', '.join(onnxruntime.get_available_providers())}"
    yield f"CUDA devices: {', '.join(_cuda_devices()) or 'none'}"
    from ..runtime.backends import BACKEND_NAMES, BackendOptions, backend_unavailable_reason

    yield "backends:"
    for name in BACKEND_NAMES:
        options = BackendOptions(device="cuda") if name == "trt" else BackendOptions()
        why = backend_unavailable_reason(name, None, options)
        yield f"  {name:<9} {'can run' if why is None else 'cannot run: ' + why}"
    why = backend_unavailable_reason("torch", None, BackendOptions(device="cuda", precision="fp16"))
    yield f"  {'torch-fp16':<9} {'can run (CUDA)' if why is None else 'cannot run: ' + why}"


def _cuda_devices() -> list[str]:
    ok, _ = available("torch")
    if not ok:
        from ..runtime.backends import cuda_device_count

        return [f"{cuda_device_count()} (via libcuda)"] if cuda_device_count() else []
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(f"cuda:{i} {p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)")
    return out
