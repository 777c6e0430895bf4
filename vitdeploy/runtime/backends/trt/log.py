"""TensorRT's one logger per process, errors captured per call, and the CUDA major TensorRT needs.

TensorRT keeps the first logger it is given for the whole process, so every Builder, Runtime and
parser gets :func:`trt_logger`'s; a call that wants to quote what TensorRT said wraps itself in
:func:`capture_errors`. Used by the trt backend and the export's engine stage alike.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator

from .. import first_line

log = logging.getLogger("vitdeploy.runtime.backends.trt")  # TensorRT's messages belong to the trt backend

# nvinfer1::ILogger::Severity values: kINTERNAL_ERROR=0, kERROR=1, kWARNING=2, kINFO=3, kVERBOSE=4.
_SEVERITY_LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.DEBUG, 4: 5}

# --------------------------------------------------------------------------------------------
# TensorRT logging -> Python logging: one logger per process, errors captured per call


_LOGGERS: dict[int, tuple[Any, Any]] = {}  # id(tensorrt module) -> (module, its one logger)
_CAPTURES: list[tuple[int, list[str]]] = []  # (thread id, sink) of the calls capturing errors now
_LOGGING_LOCK = threading.Lock()
CANCEL = threading.Event()  # set when Ctrl-C arrived inside a TensorRT callback (TensorRT swallows it there)


def _record_error(text: str) -> None:
    """Give an error TensorRT logged to the capturing calls of the logging thread (or of every
    thread, when TensorRT logs from a thread of its own)."""
    me = threading.get_ident()
    with _LOGGING_LOCK:
        sinks = [sink for ident, sink in _CAPTURES if ident == me] or [sink for _, sink in _CAPTURES]
        for sink in sinks:
            sink.append(text)


def trt_logger(trt: Any) -> Any:
    """The process's one ``trt.ILogger``, forwarding TensorRT's messages to Python ``logging``.

    TensorRT keeps the first logger it is given for the whole process and ignores later ones, so
    every Builder, Runtime and parser here gets this one; errors reach the calls inside
    :func:`capture_errors`. The callback never raises (TensorRT would swallow it): a Ctrl-C that
    lands in it sets :data:`CANCEL`, which the build's progress monitor turns into a cancel.
    """
    with _LOGGING_LOCK:
        known = _LOGGERS.get(id(trt))
        if known is not None and known[0] is trt:
            return known[1]

        class _LoggingBridge(trt.ILogger):
            def __init__(self) -> None:
                super().__init__()

            def log(self, severity: Any, msg: str) -> None:
                try:
                    level = _SEVERITY_LEVELS.get(int(severity), logging.DEBUG)
                    if level >= logging.ERROR:
                        _record_error(str(msg))
                    if log.isEnabledFor(level):
                        log.log(level, "TensorRT: %s", msg)
                except KeyboardInterrupt:
                    CANCEL.set()
                except Exception:  # noqa: BLE001 - a logging failure must not become TensorRT's problem
                    pass

        logger = _LoggingBridge()
        _LOGGERS[id(trt)] = (trt, logger)
        return logger


@contextlib.contextmanager
def capture_errors() -> Iterator[list[str]]:
    """Collect the errors TensorRT logs during the block (this thread's calls) into a list."""
    entry = (threading.get_ident(), [])
    with _LOGGING_LOCK:
        _CAPTURES.append(entry)
    try:
        yield entry[1]
    finally:
        with _LOGGING_LOCK:
            _CAPTURES[:] = [e for e in _CAPTURES if e is not entry]


def quote_errors(errors: list[str]) -> str:
    """'; TensorRT said: a | b' for the last few captured errors ('' when there were none)."""
    return ("; TensorRT said: " + " | ".join(errors[-5:])) if errors else ""


def start_tensorrt(trt: Any, kind: str, device_index: int, error: type[Exception]) -> Any:
    """``trt.Builder(logger)`` or ``trt.Runtime(logger)``; ``error`` (quoting TensorRT) when it fails.

    Where CUDA cannot initialise for TensorRT (a driver older than TensorRT's CUDA needs, a GPU
    that is busy or lost), TensorRT logs why and its factory returns nullptr, which pybind11
    raises as a bare TypeError even when torch's CUDA works.
    """
    with capture_errors() as errors:
        try:
            factory = trt.Builder if kind == "Builder" else trt.Runtime
            made = factory(trt_logger(trt))
        except (TypeError, RuntimeError) as exc:
            raise error(
                f"TensorRT {trt.__version__} could not create its {kind} on cuda:{device_index} ({first_line(exc)})"
                f"{quote_errors(errors)}; check the NVIDIA driver against the CUDA major of the installed tensorrt "
                f"wheel (README: Troubleshooting TensorRT) or use the 'ort' backend"
            ) from exc
    return made


# --------------------------------------------------------------------------------------------
# CUDA majors: TensorRT's wheel and torch (which supplies the buffers and streams) must agree


def tensorrt_cuda_major() -> int | tuple[int, ...] | None:
    """12 or 13 from the installed TensorRT wheels (tensorrt-cu12-* / tensorrt-cu13-*); None if unknown
    (a tar-file install); (12, 13) when wheels of both majors are installed (refused by
    :func:`cuda_major_mismatch`: they provide the same ``tensorrt`` module)."""
    from importlib import metadata

    found = set()
    for major in (12, 13):
        for part in ("bindings", "libs"):
            try:
                metadata.version(f"tensorrt-cu{major}-{part}")
            except metadata.PackageNotFoundError:
                continue
            found.add(major)
    if len(found) > 1:
        return tuple(sorted(found))
    return found.pop() if found else None


def _uninstall(major: int) -> str:
    return f"pip uninstall -y tensorrt-cu{major} tensorrt-cu{major}-bindings tensorrt-cu{major}-libs"


def cuda_major_mismatch(
    trt_major: int | tuple[int, ...] | None, torch_cuda: str | None, torch_version: str = ""
) -> str | None:
    """Why TensorRT (built for CUDA ``trt_major``) and torch (built for CUDA ``torch_cuda``, e.g. "13.0")
    cannot share buffers and streams, or None when they can (or either is unknown). Wheels of both
    CUDA majors (``trt_major`` a tuple) are always refused. The message ends with the one command
    that fixes it."""
    head = str(torch_cuda or "").split(".")[0]
    torch_major = int(head) if head.isdigit() else None
    if isinstance(trt_major, tuple):
        majors = " and ".join(f"tensorrt-cu{m}" for m in trt_major)
        keep = torch_major if torch_major in trt_major else max(trt_major)
        drop = " && ".join(_uninstall(m) for m in trt_major if m != keep)
        return (
            f"TensorRT wheels for two CUDA majors are installed ({majors}); they provide the same `tensorrt` "
            f"module and which one imports is undefined. Keep the one matching torch {torch_version} "
            f"(CUDA {torch_cuda or 'unknown'}): {drop}"
        )
    if trt_major is None or torch_major is None or torch_major == trt_major:
        return None
    from ....base.vocab import TENSORRT_TORCH, tensorrt_install_command, torch_fix_command

    other = (
        f"; or, to keep this torch: {_uninstall(trt_major)} && {tensorrt_install_command(torch_major)}"
        if torch_major in TENSORRT_TORCH
        else ""
    )
    return (
        f"tensorrt is built for CUDA {trt_major} (tensorrt-cu{trt_major}) but torch {torch_version} is built for "
        f"CUDA {torch_cuda}; the trt backend's buffers and streams come from torch, so both need one CUDA major. "
        f"Fix: {torch_fix_command(trt_major)}{other}"
    )
