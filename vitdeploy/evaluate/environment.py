"""`vitdeploy info`: what this machine can run, and why not where not."""

from __future__ import annotations

import platform
from typing import Iterator

from ..base._deps import available
from ..base.version import __version__
from ..base.vocab import BACKEND_KINDS, ORT_FP16, RUNTIME_BACKENDS, TORCH_FP16


def environment_report() -> Iterator[str]:
    yield f"vitdeploy {__version__} on Python {platform.python_version()} ({platform.system()} {platform.machine()})"
    yield "libraries:"
    libraries = []
    for module in ("torch", "onnx", "onnxruntime", "tensorrt", "numpy", "PIL"):
        ok, detail = available(module)
        libraries.append((module, detail if ok else f"missing: {detail}"))
    yield from _aligned(libraries)
    ok, _ = available("onnxruntime")
    if ok:
        import onnxruntime

        yield f"onnxruntime providers: {', '.join(onnxruntime.get_available_providers())}"
    yield f"CUDA devices: {', '.join(_cuda_devices()) or 'none'}"
    yield "backends:"
    yield from _aligned(_backend_rows())


def _backend_rows() -> list[tuple[str, str]]:
    """(backend, whether it can run here). ort-fp16 without a CUDA provider says what it is for,
    since ``predict``'s auto choice passes it over on the CPU."""
    from ..runtime.backends import BackendOptions, backend_unavailable_reason
    from ..runtime.predictor import cuda_provider_available

    rows = []
    for name in RUNTIME_BACKENDS:
        options = BackendOptions(device="cuda") if BACKEND_KINDS[name].device == "cuda" else BackendOptions()
        why = backend_unavailable_reason(name, None, options)
        if why is not None:
            rows.append((name, f"cannot run: {why}"))
        elif name == ORT_FP16 and not cuda_provider_available():
            rows.append(
                (name, "can run on the CPU, to check the FP16 graph: slower than ort (auto passes it over here)")
            )
        elif name == ORT_FP16:
            rows.append((name, "can run (ONNX Runtime CUDA: FP16 graph; auto picks it when there is no engine)"))
        else:
            rows.append((name, "can run"))
    why = backend_unavailable_reason("torch", None, BackendOptions(device="cuda", precision="fp16"))
    rows.append((TORCH_FP16, "can run (CUDA)" if why is None else f"cannot run: {why}"))
    return rows


def _aligned(rows: list[tuple[str, str]]) -> Iterator[str]:
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        yield f"  {name:<{width}} {text}"


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
