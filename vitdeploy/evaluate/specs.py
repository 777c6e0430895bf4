"""Which backends ``validate`` and ``bench`` judge, the file and precision each runs, how to open one.

A :class:`BackendSpec` is one row of their tables: a name from :data:`~vitdeploy.base.vocab.BACKENDS`,
the runtime backend that runs it, its options (device, precision) and the threshold set that
judges it. Opening goes through :func:`~vitdeploy.runtime.backends.open_or_reason`, as the
Predictor's auto-selection does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..base.errors import ConfigError
from ..base.vocab import BACKEND_KINDS, BACKENDS, EVALUATED_BACKENDS, TORCH_FP16
from ..runtime.backends import verify_backend_files

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime.backends import Opened

#: Every backend ``validate`` and ``bench`` know, in report order. "torch-fp16" is the torch
#: backend in half precision on CUDA; "torch" follows the configured device (CPU by default,
#: where it *is* the reference).


@dataclass(frozen=True)
class BackendSpec:
    """One row of the drift / bench tables."""

    name: str  # "torch", "ort", "ort-fp16", "torch-fp16", "trt"
    registry: str  # the runtime registry name it opens ("torch" for torch-fp16)
    options: Any  # BackendOptions
    precision: str  # "fp32" | "fp16": the threshold set that applies

    @property
    def is_reference(self) -> bool:
        """Eager FP32 PyTorch on the CPU: the reference every other backend is judged against."""
        return self.registry == "torch" and self.precision == "fp32" and _device_type(self.options.device) == "cpu"

    @property
    def uses_cuda(self) -> bool:
        return BACKEND_KINDS[self.registry].device == "cuda" or (
            self.registry == "torch" and _device_type(self.options.device) == "cuda"
        )

    @property
    def device(self) -> str:
        """Where it runs, as the drift table says it: the device (CUDA, torch, a CPU-only backend), else the
        ONNX Runtime providers."""
        if self.uses_cuda or self.registry == "torch":
            return str(self.options.device)
        if BACKEND_KINDS[self.registry].device == "cpu":
            return "cpu"
        return ", ".join(map(str, self.options.providers))

    def label(self) -> str:
        if self.registry == "torch":
            return f"{self.name} ({self.options.device}, {self.precision})"
        return self.name


def _device_type(device: str) -> str:
    return str(device).split(":", 1)[0]


def parse_backend_names(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """ "ort, ort-fp16" or ["ort"] -> ("ort", "ort-fp16"); None/""/"all" -> None (every backend).

    ConfigError naming the unknown name and the choices.
    """
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(v).strip() for v in items if str(v).strip()]
    if not names or names == ["all"]:
        return None
    unknown = [n for n in names if n not in EVALUATED_BACKENDS]
    if unknown:
        raise ConfigError(
            f"unknown backend(s) {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(EVALUATED_BACKENDS)} (comma-separated), or leave the option out for all"
        )
    return tuple(dict.fromkeys(names))


def backend_specs(names: Sequence[str] | None = None, options: Any = None) -> list[BackendSpec]:
    """The specs for ``names`` (default: all of :data:`EVALUATED_BACKENDS`), built from ``options``.

    ``options`` (BackendOptions, e.g. from pipeline.yaml's ``runtime``) supplies the device,
    ONNX Runtime providers and threads. ``torch`` runs on ``options.device`` in FP32;
    ``torch-fp16`` and ``trt`` run on CUDA (``options.device`` when it is a CUDA device, else
    ``cuda``).
    """
    from ..runtime.backends import BackendOptions

    options = options or BackendOptions()
    cuda = options.device if _device_type(options.device) == "cuda" else "cuda"
    table = {}
    for kind in BACKENDS:
        opts = dataclasses.replace(options, device=cuda) if kind.device == "cuda" else options
        if kind.runs == "torch":  # the torch backend runs either precision; the others' is in their file
            opts = dataclasses.replace(opts, precision=kind.precision)
        table[kind.name] = BackendSpec(kind.name, kind.runs, opts, kind.precision)
    chosen = parse_backend_names(names) if names is not None else None
    return [table[n] for n in (chosen or EVALUATED_BACKENDS)]


def reference_options(options: Any = None) -> Any:
    """BackendOptions of the reference: torch on the CPU in FP32 (threads kept from ``options``)."""
    from ..runtime.backends import BackendOptions

    return BackendOptions(device="cpu", precision="fp32", threads=getattr(options, "threads", None))


def spec_unavailable_reason(spec: BackendSpec, artifacts: Any) -> str | None:
    """Why ``spec`` cannot run here (one line), or None. Cheap: no hashing, no session."""
    from ..runtime.backends import backend_unavailable_reason

    return _spec_reason(spec, backend_unavailable_reason(spec.registry, artifacts, spec.options))


def _spec_reason(spec: BackendSpec, reason: str | None) -> str | None:
    if reason and spec.name == TORCH_FP16 and "manifest" not in reason:
        return f"needs a CUDA GPU: {reason}"
    return reason


def verify_spec_files(spec: BackendSpec, artifacts: Any) -> None:
    """Check the size and sha256 of every file ``spec`` reads; ArtifactError for a missing,
    tampered or escaping file (such a file is never skipped silently)."""
    verify_backend_files(spec.registry, artifacts)


def open_spec(spec: BackendSpec, artifacts: Any) -> Any:
    """Verify the files of ``spec`` (:func:`verify_spec_files`), then open its backend."""
    from ..runtime.backends import open_backend

    verify_spec_files(spec, artifacts)
    return open_backend(spec.registry, artifacts, spec.options)


def try_open_spec(spec: BackendSpec, artifacts: Any) -> Opened:
    """Open the backend of ``spec``, or say why not (:func:`~vitdeploy.runtime.backends.open_or_reason`):
    status "unavailable" with the reason :func:`spec_unavailable_reason` gives, or "error" when
    it failed to open. A missing or tampered file raises ArtifactError."""
    from ..runtime.backends import open_or_reason

    opened = open_or_reason(spec.registry, artifacts, spec.options)
    if opened.status == "unavailable":
        return dataclasses.replace(opened, reason=_spec_reason(spec, opened.reason))
    return opened


__all__ = [
    "BackendSpec",
    "backend_specs",
    "open_spec",
    "parse_backend_names",
    "reference_options",
    "spec_unavailable_reason",
    "try_open_spec",
    "verify_spec_files",
]
