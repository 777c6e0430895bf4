"""Build TensorRT engines (an engine file + its .json) from ONNX graphs: the FP16 engine
(model.engine) from model.fp16.onnx, the INT8 engine (model.int8.engine) from the Q/DQ graph
model.int8.trt.onnx.

Written against the TensorRT 10.x and 11.x Python API. Precision comes from the graph, never
from builder flags: TensorRT 11 removed weak typing (``BuilderFlag.FP16`` no longer exists,
every network is strongly typed), and on 10.x we ask for the same behaviour with
``NetworkDefinitionCreationFlag.STRONGLY_TYPED``. So an FP16 engine is built from
model.fp16.onnx (FP16 inside, float32 I/O) and runs exactly the types that graph declares. The
INT8 engine takes the same path: TensorRT's explicit quantization reads INT8 from the graph's
QuantizeLinear/DequantizeLinear pairs ("Use explicit quantization with Strong Typing.
Precision-control build flags are not required and should not be specified": NVIDIA TensorRT
developer guide, Explicit Quantization), so ``BuilderFlag.INT8`` is never set; the layers without
Q/DQ run in the graph's float32.

What one build needs is an :class:`~.engine_plan.EngineBuildPlan` (``engine_plan.plan_engine_build`` checks
the settings). ``build_engine`` takes the ``tensorrt`` module as an argument (imported lazily when None) so the
build logic can be tested with a stand-in module where TensorRT cannot be installed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from ..base._deps import require
from ..base._files import atomic_path
from ..base.errors import ExportError
from ..runtime.artifacts import sha256_file
from ..runtime.backends.trt import (
    CANCEL,
    INSTALL_HINT,
    EngineMetadata,
    _TorchCuda,
    capture_errors,
    cuda_major_mismatch,
    quote_errors,
    start_tensorrt,
    tensorrt_cuda_major,
    trt_logger,
    unavailable_reason,
)
from ..runtime.cuda import GpuIdentity, gpu_identity
from .engine_plan import EngineBuildPlan

log = logging.getLogger(__name__)


def tensorrt_unavailable_reason(device: str = "cuda:0") -> str | None:
    """None when ``tensorrt`` imports and can start on the CUDA GPU ``device``; else why not, in one line.

    The check itself lives with the trt backend (one implementation for export and runtime).
    """
    from ..runtime.backends.base import BackendOptions

    return unavailable_reason(None, BackendOptions(device=device))


# --------------------------------------------------------------------------------------------
# helpers


def tensorrt_major(version: str) -> int:
    """10 for "10.13.3.9"; ExportError for an unparseable version."""
    head = str(version).split(".")[0]
    if not head.isdigit():
        raise ExportError(f"cannot read the TensorRT major version from tensorrt.__version__={version!r}")
    return int(head)


def _network_flags(trt: Any, major: int) -> int:
    """The ``create_network`` flags: STRONGLY_TYPED on 10.x, nothing on 11.x.

    Networks are always strongly typed (precision comes from the ONNX graph). TensorRT 11 makes
    every network strongly typed; its NetworkDefinitionCreationFlag.STRONGLY_TYPED (still in the
    11.4 bindings) is deprecated and ignored, so it is not passed there.
    """
    if major >= 11:
        return 0
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if flag is None:
        raise ExportError(
            f"this TensorRT ({major}.x) has no NetworkDefinitionCreationFlag.STRONGLY_TYPED: "
            f"vitdeploy needs TensorRT >= 10.0 ({INSTALL_HINT})"
        )
    return 1 << int(flag)


def _write_engine_pair(plan: EngineBuildPlan, engine: Any, meta: EngineMetadata) -> None:
    """model.engine and model.engine.json, both or neither.

    Both are complete under temporary names first. Then the old json goes, the engine is renamed
    and its json right after, so an engine never sits beside a json that is not its own (the
    backend refuses an engine without its json). Any failure removes both final names.
    """
    text = (json.dumps(meta.to_dict(), indent=2) + "\n").encode("utf-8")
    try:
        with contextlib.ExitStack() as temps:
            engine_tmp = temps.enter_context(_temp_beside(plan.engine_path))
            meta_tmp = temps.enter_context(_temp_beside(plan.meta_path))
            with open(engine_tmp, "wb") as handle:
                handle.write(engine)
            meta_tmp.write_bytes(text)
            plan.meta_path.unlink(missing_ok=True)
            os.replace(engine_tmp, plan.engine_path)
            os.replace(meta_tmp, plan.meta_path)
    except BaseException as exc:
        plan.engine_path.unlink(missing_ok=True)
        plan.meta_path.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ExportError(f"cannot write {plan.engine_path} and {plan.meta_path.name}: {exc}") from exc
        raise


@contextlib.contextmanager
def _temp_beside(final: Path):
    """A temporary file beside ``final``, removed on leaving unless it was renamed away."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _attach_timing_cache(config: Any, path: Path | None) -> None:
    """Load ``path`` (when it exists) into a timing cache and attach it to the builder config.

    A cache from another TensorRT version or GPU is refused by TensorRT (ignore_mismatch=False);
    the build then starts from an empty cache, which replaces the file afterwards.
    """
    if path is None:
        return
    data = b""
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as exc:
            log.warning("cannot read the TensorRT timing cache %s (%s); starting an empty one", path, exc)
    if data:
        cache = config.create_timing_cache(data)
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            log.info("TensorRT timing cache: reusing %s (%d bytes)", path, len(data))
            return
        log.warning(
            "TensorRT timing cache %s was made by another TensorRT version or GPU; starting an empty one (the file "
            "will be replaced)",
            path,
        )
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise ExportError(f"TensorRT could not create a timing cache for {path}")


def _save_timing_cache(config: Any, path: Path | None) -> None:
    """Write the updated timing cache; best effort: the engine is already built and written, so a
    cache that cannot be saved (read-only path, a directory, a full disk) is only a warning."""
    if path is None:
        return
    try:
        cache = config.get_timing_cache()
        if cache is None:
            log.warning("TensorRT returned no timing cache; %s not updated", path)
            return
        with atomic_path(path) as tmp, open(tmp, "wb") as handle:
            handle.write(memoryview(cache.serialize()))
    except Exception as exc:  # noqa: BLE001 - the cache only speeds up the next build
        log.warning(
            "TensorRT timing cache not saved to %s (%s); the engine is fine, the next build just starts "
            "without it. Set tensorrt.timing_cache to a writable file to keep it",
            path,
            exc,
        )
        return
    log.info("TensorRT timing cache: saved %s", path)


@contextlib.contextmanager
def _ctrl_c_cancels() -> Iterator[None]:
    """While the block runs (on the main thread), Ctrl-C sets :data:`CANCEL` instead of raising.

    A SIGINT that arrives while TensorRT's C++ builds is handled by Python at the first
    instruction of the next Python callback (the logger, the progress monitor), before any
    ``try`` inside it (CPython >= 3.11), and TensorRT's trampolines swallow the
    KeyboardInterrupt: the build would end as "failed to build". So during the build SIGINT only
    sets the flag, the monitor's ``step_complete`` returns False, and build_engine raises
    KeyboardInterrupt after the build returns. The previous handler is restored on leaving.
    Elsewhere than the main thread (where Python never runs signal handlers) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):  # Ctrl-C ignored (nohup), or a handler not installed from Python
        yield
        return

    def cancel(signum: int, frame: Any) -> None:
        CANCEL.set()

    signal.signal(signal.SIGINT, cancel)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _progress_monitor(trt: Any, report: Callable[[str], None] | None) -> Any:
    """A ``trt.IProgressMonitor`` that reports build phases and cancels the build on Ctrl-C.

    ``step_complete`` returns False once :data:`CANCEL` is set (by the SIGINT handler of
    :func:`_ctrl_c_cancels`), and build_engine raises KeyboardInterrupt after the build returns.
    The KeyboardInterrupt handlers inside the callbacks are a second line for a build run without
    that handler; a Ctrl-C that Python raises before the first line of a callback never reaches them.
    """

    class _Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            super().__init__()
            self.steps: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                self.steps[phase_name] = int(num_steps)
                if parent_phase is None:
                    log.info("TensorRT build: %s (%d steps)", phase_name, num_steps)
                    if report is not None:
                        report(f"{phase_name} (0/{num_steps})")
            except KeyboardInterrupt:
                CANCEL.set()
            except Exception:  # noqa: BLE001 - progress must never break the build
                pass

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                total = self.steps.get(phase_name, 0)
                log.debug("TensorRT build: %s step %d/%d", phase_name, step + 1, total)
                if report is not None and total and phase_name == next(iter(self.steps), None):
                    report(f"{phase_name} ({step + 1}/{total})")
            except KeyboardInterrupt:
                CANCEL.set()
            except Exception:  # noqa: BLE001
                pass
            return not CANCEL.is_set()

        def phase_finish(self, phase_name: str) -> None:
            try:
                self.steps.pop(phase_name, None)
            except KeyboardInterrupt:
                CANCEL.set()

    return _Monitor()


# --------------------------------------------------------------------------------------------
# the build


def build_engine(
    plan: EngineBuildPlan,
    trt: Any = None,
    *,
    device_probe: Callable[[int], GpuIdentity] | None = None,
    cuda: Any = None,
    progress: Callable[[str], None] | None = None,
) -> EngineMetadata:
    """Build ``plan.engine_path`` (+ its .json) from ``plan.onnx_path`` on cuda:``plan.device``.

    ``trt``: the tensorrt module (imported when None). ``device_probe(index)``: the GPU the engine
    is built on (default: through torch). ``cuda``: sets the current device (default: torch).
    ``progress(text)``: called with the build phase as it advances. ExportError when TensorRT
    cannot start, parse or build, quoting TensorRT's logged errors; KeyboardInterrupt when the
    build was cancelled with Ctrl-C. Never leaves a partial model.engine, or an engine without
    its json. The timing cache is saved last, best effort.
    """
    if trt is None:
        trt = require("tensorrt", "building the TensorRT engine")
    if not plan.onnx_path.is_file():
        raise ExportError(f"ONNX graph {plan.onnx_path} does not exist; export the ONNX stage first")
    version = str(trt.__version__)
    major = tensorrt_major(version)
    if major < 10:
        raise ExportError(f"TensorRT {version} is too old: vitdeploy needs TensorRT 10.x or 11.x ({INSTALL_HINT})")
    cuda = cuda if cuda is not None else _TorchCuda()
    mismatch = cuda_major_mismatch(
        tensorrt_cuda_major(), getattr(cuda, "cuda_version", None), getattr(cuda, "torch_version", "")
    )
    if mismatch:
        raise ExportError(mismatch)
    gpu = (device_probe or gpu_identity)(plan.device)
    CANCEL.clear()
    with _ctrl_c_cancels(), cuda.device(plan.device), capture_errors() as errors:
        try:
            serialized, config = _build(plan, trt, major, gpu, errors, progress)
        except ExportError:
            if CANCEL.is_set():  # Ctrl-C, then a failure it caused (e.g. the parse saw the cancel)
                raise KeyboardInterrupt("TensorRT engine build cancelled") from None
            raise
    if CANCEL.is_set():
        raise KeyboardInterrupt("TensorRT engine build cancelled")
    if serialized is None:
        raise ExportError(
            f"TensorRT {version} failed to build an engine from {plan.onnx_path} on cuda:{plan.device} "
            f"{gpu.describe()}{quote_errors(errors)}; check that input '{plan.input_name}' exists with shape "
            f"(batch, {', '.join(map(str, plan.chw))}) and try a larger workspace_mb (now {plan.workspace_mb})"
        )

    precision_text = f"{plan.precision} (strongly typed from the {plan.precision.upper()} ONNX graph)"
    if plan.precision == "int8":
        precision_text = "int8 (explicit quantization: strongly typed from the Q/DQ ONNX graph, the rest float32)"
    meta = EngineMetadata(
        tensorrt_version=version,
        gpu_name=gpu.name,
        compute_capability=gpu.compute_capability,
        profile={"min": plan.min_batch, "opt": plan.opt_batch, "max": plan.max_batch},
        input=plan.input_name,
        chw=plan.chw,
        precision=precision_text,
        onnx_sha256=sha256_file(plan.onnx_path),
        workspace_mb=plan.workspace_mb,
        optimization_level=plan.optimization_level,
        built=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    _write_engine_pair(plan, memoryview(serialized), meta)
    log.info("wrote %s and %s", plan.engine_path, plan.meta_path)
    _save_timing_cache(config, plan.timing_cache_path)
    return meta


def _build(
    plan: EngineBuildPlan,
    trt: Any,
    major: int,
    gpu: GpuIdentity,
    errors: list[str],
    progress: Callable[[str], None] | None,
) -> tuple[Any, Any]:
    """Parse and build with the plan's GPU current; (serialized engine or None, builder config)."""
    version = str(trt.__version__)
    builder = start_tensorrt(trt, "Builder", plan.device, ExportError)
    flags = _network_flags(trt, major)
    network = builder.create_network(flags) if flags else builder.create_network()
    parser = trt.OnnxParser(network, trt_logger(trt))
    # parse_from_file (not parse(bytes)) so external data files beside the ONNX graph resolve.
    if not parser.parse_from_file(str(plan.onnx_path)):
        found = [str(parser.get_error(i)) for i in range(int(parser.num_errors))]
        listing = (
            "\n".join(f"  {i + 1}. {text}" for i, text in enumerate(found)) or "  (the parser reported no details)"
        )
        raise ExportError(
            f"TensorRT {version} could not parse {plan.onnx_path} ({len(found)} error(s)):\n{listing}\n"
            "Check the graph with onnx.checker and ONNX Runtime, or use a TensorRT version that supports these "
            "operators."
        )

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes)
    config.builder_optimization_level = plan.optimization_level
    # Lets the runtime's update_device_memory_size_for_shapes() shrink the activation memory to the
    # batch it runs (the trt backend's USER_MANAGED contexts); opt-in on 10.13 and 11.x alike.
    # (older 10.x lack the member; without it the runtime cannot shrink below the profile max: NvInfer.h)
    if hasattr(trt.PreviewFeature, "RUNTIME_ACTIVATION_RESIZE_10_10"):
        config.set_preview_feature(trt.PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10, True)
    config.progress_monitor = _progress_monitor(trt, progress)
    profile = builder.create_optimization_profile()
    shape_min, shape_opt, shape_max = plan.profile_shapes()
    try:
        profile.set_shape(plan.input_name, shape_min, shape_opt, shape_max)
    except RuntimeError as exc:
        raise ExportError(
            f"TensorRT rejected the optimisation profile {shape_min}/{shape_opt}/{shape_max} for input "
            f"'{plan.input_name}' ({exc}){quote_errors(errors)}"
        ) from exc
    if config.add_optimization_profile(profile) < 0:
        raise ExportError(
            f"TensorRT rejected the optimisation profile {shape_min}/{shape_opt}/{shape_max} for input "
            f"'{plan.input_name}' of {plan.onnx_path}{quote_errors(errors)}"
        )
    _attach_timing_cache(config, plan.timing_cache_path)

    log.info(
        "building TensorRT %s engine from %s on cuda:%d %s (batch %d/%d/%d, workspace %d MiB, level %d)",
        version,
        plan.onnx_path,
        plan.device,
        gpu.describe(),
        plan.min_batch,
        plan.opt_batch,
        plan.max_batch,
        plan.workspace_mb,
        plan.optimization_level,
    )
    return builder.build_serialized_network(network, config), config
