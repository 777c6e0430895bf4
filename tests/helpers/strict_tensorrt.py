"""A strict stand-in for the ``tensorrt`` module, built from the real bindings' signatures.

Every class here is checked against tests/data/tensorrt/python-api-signatures-{10.13,11.1}.json
(extracted from NVIDIA's pybind11 sources, see the README there): each public method and
property must exist on that Python class in that version, and every call is bound against the
real overloads' keyword names (unknown keywords, missing arguments and extra positionals raise
TypeError like pybind11's "incompatible function arguments"). Enum values are the real ones.

It also behaves like TensorRT where our code depends on it:
- ``IOptimizationProfile.set_shape`` raises RuntimeError unless min <= opt <= max;
- ``IExecutionContext.set_input_shape`` returns False outside the engine's profile;
- ``set_tensor_address`` wants an int (a device pointer) aligned to 256 bytes;
- ``execute_async_v3`` refuses stream 0 (our code must use its own stream);
- a timing cache made by another TensorRT version or GPU is refused by ``set_timing_cache``;
- a logger must run ``ILogger.__init__``, gets ``ILogger.Severity`` members, and exceptions it
  raises are swallowed (printed), as TensorRT's trampoline does; TensorRT keeps the FIRST
  logger it is given for the whole process (``process_logger``), later ones are ignored;
- ``Builder`` / ``Runtime`` raise pybind11's TypeError "factory function returned nullptr"
  after logging an error when CUDA cannot initialise (``cuda_init_fails=True``);
- ``build_serialized_network`` reports through the config's ``progress_monitor`` and returns
  None when ``step_complete`` returns False (a cancelled build). The monitor is called through
  trampolines like pyCore.cpp's ``PyProgressMonitor``: an exception from ``phase_start`` /
  ``phase_finish`` is swallowed, one from ``step_complete`` is swallowed and read as False.
  ``sigint_at_step=k`` sends a real SIGINT to the main thread at step k, from C (the call chain
  from the trampoline to the callback has no Python frame of the fake), as a Ctrl-C during
  TensorRT's C++ work arrives: Python handles it before the callback's first line;
- objects are pybind11 instances without a ``__dict__``: assigning an attribute the version's class
  does not have (``config.max_workspace_size = ...``) or a read-only property raises
  AttributeError (Python subclasses of ILogger / IProgressMonitor have a ``__dict__``, as there);
- arguments are type-checked as pyCore.cpp / pyOnnx.cpp declare them (:data:`ARG_TYPES`):
  ``parse_from_file`` takes a ``str`` (not a Path), shapes are tuples or lists of ints (a numpy
  array is refused: stricter than pybind11's implicit sequence->Dims conversion may be, on
  purpose), enums must be the enum (``strategy=123`` is refused), addresses and sizes are ints;
- ``execute_async_v3`` fails (logs, returns False) without ``set_input_shape``, and on a
  USER_MANAGED context without ``set_device_memory`` of the size
  ``update_device_memory_size_for_shapes`` asked for the current shape;
- ``on_execute(context, stream_handle)`` (tests) sees each run, e.g. to check that every buffer
  was written on the stream the run uses.

It is a test double for OUR code. It is never evidence that TensorRT itself works.
"""

from __future__ import annotations

import enum
import functools
import json
import operator
import signal
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

DATA = Path(__file__).resolve().parents[1] / "data" / "tensorrt"
SIGNATURE_FILES = {10: DATA / "python-api-signatures-10.13.json", 11: DATA / "python-api-signatures-11.1.json"}
NULLPTR = "pybind11::init(): factory function returned nullptr"


@functools.lru_cache(maxsize=None)
def signatures(major: int) -> dict[str, Any]:
    return json.loads(SIGNATURE_FILES[major].read_text(encoding="utf-8"))


def _bind(overloads: list[list[str]], args: tuple, kwargs: dict, where: str) -> dict[str, Any]:
    """{parameter: value} of the first real overload (args, kwargs) fit; TypeError if none does."""
    for params in overloads:
        names = [p.rstrip("=") for p in params]
        required = [p for p in params if not p.endswith("=")]
        if len(args) > len(names):
            continue
        given = set(names[: len(args)])
        if any(k not in names or k in given for k in kwargs):
            continue
        given |= set(kwargs)
        if all(r in given for r in required):
            return {**dict(zip(names, args)), **kwargs}
    raise TypeError(
        f"{where}(): incompatible function arguments: args={args!r} kwargs={sorted(kwargs)}; "
        f"the real overloads take {[', '.join(p) for p in overloads]}"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dims(value: Any) -> bool:
    """A TensorRT shape as our code passes it: a tuple or list of ints (pybind11's tuple/list overloads)."""
    return isinstance(value, (tuple, list)) and all(_is_int(d) or type(d).__name__.startswith("int") for d in value)


#: (class, method) -> {parameter: (what, check(fake, value))}, from the C++ parameter types in
#: python/src/infer/pyCore.cpp and python/src/parsers/pyOnnx.cpp (10.13 and main = 11.x alike).
_STR = ("str", lambda fake, v: isinstance(v, str))
_INT = ("int", lambda fake, v: _is_int(v))
_SIZE = ("int >= 0 (size_t)", lambda fake, v: _is_int(v) and v >= 0)
_BOOL = ("bool", lambda fake, v: isinstance(v, bool))
_DIMS = ("a tuple or list of ints (Dims)", lambda fake, v: _dims(v))
_BUFFER = ("a buffer (bytes, memoryview)", lambda fake, v: isinstance(v, (bytes, bytearray, memoryview)))


def _enum(name: str):
    return (f"tensorrt.{name}", lambda fake, v: isinstance(v, getattr(fake, name)))


ARG_TYPES: dict[tuple[str, str], dict[str, tuple[str, Callable[[Any, Any], bool]]]] = {
    ("OnnxParser", "parse_from_file"): {"model": _STR},
    ("OnnxParser", "get_error"): {"index": _INT},
    ("Builder", "create_network"): {"flags": _INT},
    ("IBuilderConfig", "set_memory_pool_limit"): {"pool": _enum("MemoryPoolType"), "pool_size": _SIZE},
    ("IBuilderConfig", "set_preview_feature"): {"feature": _enum("PreviewFeature"), "enable": _BOOL},
    ("IBuilderConfig", "create_timing_cache"): {"serialized_timing_cache": _BUFFER},
    ("IBuilderConfig", "set_timing_cache"): {"ignore_mismatch": _BOOL},
    ("IOptimizationProfile", "set_shape"): {"input": _STR, "min": _DIMS, "opt": _DIMS, "max": _DIMS},
    ("Runtime", "deserialize_cuda_engine"): {"serialized_engine": _BUFFER},
    ("ICudaEngine", "get_tensor_name"): {"index": _INT},
    ("ICudaEngine", "get_tensor_mode"): {"name": _STR},
    ("ICudaEngine", "get_tensor_shape"): {"name": _STR},
    ("ICudaEngine", "get_tensor_dtype"): {"name": _STR},
    ("ICudaEngine", "get_tensor_profile_shape"): {"name": _STR, "profile_index": _INT},
    ("ICudaEngine", "create_execution_context"): {"strategy": _enum("ExecutionContextAllocationStrategy")},
    ("IExecutionContext", "set_input_shape"): {"name": _STR, "shape": _DIMS},
    ("IExecutionContext", "get_tensor_shape"): {"name": _STR},
    ("IExecutionContext", "set_tensor_address"): {"name": _STR, "memory": _SIZE},
    ("IExecutionContext", "execute_async_v3"): {"stream_handle": _SIZE},
    ("IExecutionContext", "set_device_memory"): {"memory": _SIZE, "size": _INT},
}


def _check_types(fake: Any, py_name: str, name: str, bound: dict[str, Any]) -> None:
    for param, (what, ok) in ARG_TYPES.get((py_name, name), {}).items():
        if param in bound and not ok(fake, bound[param]):
            raise TypeError(
                f"{py_name}.{name}(): incompatible function arguments: {param} must be {what}, "
                f"got {type(bound[param]).__name__} {bound[param]!r}"
            )


def _strict_setattr(self: Any, name: str, value: Any) -> None:
    """pybind11 classes have no __dict__: only the version's properties (rw) can be assigned. The fake's
    own state (set in its __init__, or private) is exempt; so are Python subclasses (they have a __dict__)."""
    cls = type(self)
    if (
        not cls.__dict__.get("_strict_class")
        or name.startswith("_")
        or not self.__dict__.get("_sealed")
        or name in self.__dict__
    ):
        return object.__setattr__(self, name, value)
    spec = signatures(self._major)["classes"][cls._py_name]
    access = spec["properties"].get(name)
    if access is None:
        raise AttributeError(f"'tensorrt.{cls._py_name}' object has no attribute '{name}' (tensorrt {self._major}.x)")
    if access != "rw":
        raise AttributeError(f"tensorrt.{cls._py_name}.{name} is read-only (can't set attribute)")
    if isinstance(getattr(cls, name, None), property):
        return object.__setattr__(self, name, value)
    self._fake.calls.append(("set", cls._py_name, name, value))  # a real property the fake does not model
    self.__dict__.setdefault("_unmodelled", {})[name] = value


def strict(py_name: str) -> Callable[[type], type]:
    """Class decorator: every public method/property must exist on ``py_name`` in the real bindings;
    method calls (and __init__) are bound against the real overloads."""

    def wrap(cls: type) -> type:
        cls._py_name = py_name
        original_init = cls.__init__

        internal = cls.__dict__.get("_fake_internal_init", False)  # objects TensorRT makes are not user-constructible

        @functools.wraps(original_init)
        def __init__(self, *args, **kwargs):
            if not internal:
                spec = signatures(self._major)["classes"].get(py_name)
                if spec is None:
                    raise AssertionError(f"tensorrt {self._major}.x has no class {py_name}")
                if not spec["init"]:
                    raise TypeError(f"tensorrt.{py_name} cannot be instantiated from Python (no constructor bound)")
                _bind(spec["init"], args, kwargs, f"{py_name}.__init__")
            original_init(self, *args, **kwargs)
            if type(self) is cls:
                object.__setattr__(self, "_sealed", True)

        cls.__init__ = __init__
        cls._strict_class = True
        cls.__setattr__ = _strict_setattr
        for name, member in list(cls.__dict__.items()):
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                cls._properties = {*getattr(cls, "_properties", set()), name}
                continue
            if callable(member):
                setattr(cls, name, _checked_method(py_name, name, member))
        return cls

    return wrap


def _checked_method(py_name: str, name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        spec = signatures(self._major)["classes"][py_name]
        overloads = spec["methods"].get(name)
        if overloads is None:
            raise AttributeError(f"tensorrt {self._major}.x: {py_name} has no method {name!r}")
        _check_types(self._fake, py_name, name, _bind(overloads, args, kwargs, f"{py_name}.{name}"))
        return fn(self, *args, **kwargs)

    return method


def check_fake_against_bindings(module: "StrictTrt") -> list[str]:
    """Names the fake defines that the real bindings of its version lack (should be [])."""
    spec = signatures(min(max(module.major, 10), 11))["classes"]
    missing = []
    for cls in module.fake_classes():
        real = spec.get(cls._py_name)
        if real is None:
            missing.append(cls._py_name)
            continue
        for name, member in cls.__dict__.items():
            if name.startswith("_") or isinstance(member, type) or isinstance(member, enum.Enum):
                continue
            if isinstance(member, property):
                if name not in real["properties"]:
                    missing.append(f"{cls._py_name}.{name} (property)")
            elif callable(member) and name not in real["methods"]:
                missing.append(f"{cls._py_name}.{name}")
    return missing


class StrictTrt:
    """One stand-in ``tensorrt`` module. ``version``: "10.13.3.9" or "11.4.0.106" (signatures of 11.1).

    Build knobs: ``cuda_init_fails``, ``parse_errors``, ``build_result`` (bytes or None),
    ``build_log_error``, ``build_steps``, ``gpu`` (the timing-cache identity).
    Runtime knobs: ``engine`` (what deserialize_cuda_engine returns; see :meth:`make_engine`).
    """

    def __init__(
        self,
        version: str = "10.13.3.9",
        *,
        cuda_init_fails: bool = False,
        parse_errors: tuple[str, ...] = (),
        build_result: bytes | None = b"serialized-engine-bytes",
        build_log_error: str | None = None,
        build_steps: int = 3,
        gpu: str = "NVIDIA H100 80GB HBM3",
        engine: Any = None,
        on_step: Callable[[int], None] | None = None,
        sigint_at_step: int | None = None,
    ) -> None:
        self.__version__ = version
        self.major = int(version.split(".")[0])
        spec = signatures(min(max(self.major, 10), 11))  # a TensorRT older than 10 is refused before any call
        self.calls: list[tuple] = []
        self.process_logger: Any = None  # TensorRT keeps the first logger of the process
        self.config: Any = None
        self.engine = engine
        self.swallowed: list[BaseException] = []
        self.observe: Callable[[], Any] | None = None  # tests: e.g. the current CUDA device, added to runtime calls
        self.on_execute: Callable[[Any, int], None] | None = None  # tests: (context, stream handle) at each run
        self.steps_run: list[int] = []  # build steps whose step_complete was called
        fake = self
        major = self.major

        def enum_of(key: str, name: str) -> type[enum.IntEnum]:
            return enum.IntEnum(name, spec["enums"][key])

        self.DataType = enum_of("DataType", "DataType")
        self.TensorIOMode = enum_of("TensorIOMode", "TensorIOMode")
        self.MemoryPoolType = enum_of("MemoryPoolType", "MemoryPoolType")
        self.NetworkDefinitionCreationFlag = enum_of("NetworkDefinitionCreationFlag", "NetworkDefinitionCreationFlag")
        self.ExecutionContextAllocationStrategy = enum_of(
            "ExecutionContextAllocationStrategy", "ExecutionContextAllocationStrategy"
        )
        self.PreviewFeature = enum_of("PreviewFeature", "PreviewFeature")
        Severity = enum_of("ILogger.Severity", "Severity")

        def emit(severity: int, msg: str) -> None:
            """TensorRT logging: to the process's first logger; its exceptions are swallowed."""
            logger = fake.process_logger
            if logger is None:
                return
            try:
                logger.log(Severity(severity), msg)
            except BaseException as exc:  # noqa: BLE001 - the C++ trampoline catches everything
                fake.swallowed.append(exc)

        def register(logger: Any, who: str) -> None:
            if not isinstance(logger, ILogger) or not getattr(logger, "_base_initialised", False):
                raise TypeError(
                    f"{who}: logger must be a tensorrt.ILogger whose __init__ ran "
                    "(pybind11: __init__() must be called when overriding __init__)"
                )
            if fake.process_logger is None:
                fake.process_logger = logger
            elif logger is not fake.process_logger:
                fake.calls.append(("logger-ignored", who))

        self.emit = emit

        class _Base:
            _major = min(max(major, 10), 11)
            _fake = fake

        def trampoline(monitor: Any, method: str, *args: Any) -> Any:
            """pyCore.cpp's PyProgressMonitor: every exception is caught (printed there); step_complete
            then returns False ("use the exception as an indicator that we should cancel the build")."""
            call = functools.partial(getattr(monitor, method), *args)
            chain = [call]
            if method == "step_complete" and args[1] == sigint_at_step:
                # A Ctrl-C while TensorRT's C++ runs: a real SIGINT to the main thread, sent from C
                # (map / operator.call / partial are C), so no Python line of the fake runs between
                # its delivery and the callback; Python handles it before the callback's first line.
                chain = [functools.partial(signal.pthread_kill, threading.main_thread().ident, signal.SIGINT), call]
            try:
                return list(map(operator.call, chain))[-1]
            except BaseException as exc:  # noqa: BLE001 - catch (...) in the C++ trampoline
                fake.swallowed.append(exc)
                return False if method == "step_complete" else None

        @strict("ILogger")
        class ILogger(_Base):
            def __init__(self) -> None:
                self._base_initialised = True

            def log(self, severity, msg):  # pragma: no cover - subclasses override
                raise NotImplementedError

        ILogger.Severity = Severity
        for member in Severity:
            setattr(ILogger, member.name, member)

        @strict("IProgressMonitor")
        class IProgressMonitor(_Base):
            def __init__(self) -> None:
                self._base_initialised = True

            def phase_start(self, phase_name, parent_phase, num_steps):  # pragma: no cover
                raise NotImplementedError

            def step_complete(self, phase_name, step):  # pragma: no cover
                raise NotImplementedError

            def phase_finish(self, phase_name):  # pragma: no cover
                raise NotImplementedError

        def _internal(cls):
            cls._fake_internal_init = True  # made by the fake itself, never constructed by user code
            return cls

        @strict("ITimingCache")
        @_internal
        class ITimingCache(_Base):
            def __init__(self, header: bytes, body: bytes) -> None:
                self.header, self.body = header, body

            def serialize(self):
                return self.header + b"\n" + self.body + b"+tuned"

        here = f"fake-timing-cache/{version}/{gpu}".encode()

        @strict("IOptimizationProfile")
        @_internal
        class IOptimizationProfile(_Base):
            def __init__(self) -> None:
                self.shapes: dict[str, tuple] = {}

            def set_shape(self, input, min, opt, max):  # noqa: A002 - the real keyword names
                dims = [tuple(int(d) for d in s) for s in (min, opt, max)]
                fake.calls.append(("set_shape", input, *dims))
                if len({len(d) for d in dims}) != 1:
                    raise RuntimeError("Shape provided for opt is inconsistent with other shapes.")
                for label, (low, high) in (("opt", (dims[0], dims[1])), ("max", (dims[1], dims[2]))):
                    if any(a > b for a, b in zip(low, high)):
                        raise RuntimeError(f"Shape provided for {label} is inconsistent with other shapes.")
                self.shapes[input] = tuple(dims)

        @strict("IBuilderConfig")
        @_internal
        class IBuilderConfig(_Base):
            def __init__(self) -> None:
                self._level = 3
                self._monitor = None
                self.cache = None
                self.profiles: list = []
                self.preview: dict = {}

            @property
            def builder_optimization_level(self):
                return self._level

            @builder_optimization_level.setter
            def builder_optimization_level(self, value):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TypeError("builder_optimization_level: incompatible function arguments")
                self._level = value

            @property
            def progress_monitor(self):
                return self._monitor

            @progress_monitor.setter
            def progress_monitor(self, monitor):
                if not isinstance(monitor, IProgressMonitor) or not getattr(monitor, "_base_initialised", False):
                    raise TypeError("progress_monitor: expected a tensorrt.IProgressMonitor whose __init__ ran")
                self._monitor = monitor

            def set_memory_pool_limit(self, pool, pool_size):
                if not isinstance(pool, fake.MemoryPoolType):
                    raise TypeError(f"set_memory_pool_limit: pool must be a MemoryPoolType, got {pool!r}")
                fake.calls.append(("set_memory_pool_limit", pool, pool_size))

            def set_preview_feature(self, feature, enable):
                fake.calls.append(("set_preview_feature", feature, enable))
                self.preview[feature] = enable

            def add_optimization_profile(self, profile):
                fake.calls.append(("add_optimization_profile",))
                self.profiles.append(profile)
                return len(self.profiles) - 1

            def create_timing_cache(self, serialized_timing_cache):
                data = bytes(memoryview(serialized_timing_cache))
                fake.calls.append(("create_timing_cache", data))
                if not data:
                    return ITimingCache(here, b"")
                header, _, body = data.partition(b"\n")
                return ITimingCache(header, body)

            def set_timing_cache(self, cache, ignore_mismatch):
                fake.calls.append(("set_timing_cache", cache.header, cache.body, ignore_mismatch))
                if cache.header != here and not ignore_mismatch:
                    emit(
                        1,
                        f"Timing cache was created by {cache.header.decode(errors='replace')}; this is {here.decode()}",  # noqa: E501
                    )
                    return False
                self.cache = cache
                return True

            def get_timing_cache(self):
                return self.cache

        @strict("INetworkDefinition")
        @_internal
        class INetworkDefinition(_Base):
            def __init__(self, flags: int) -> None:
                self.flags = flags

        @strict("Builder")
        class Builder(_Base):
            def __init__(self, logger) -> None:
                register(logger, "Builder")
                fake.calls.append(("Builder",))
                if cuda_init_fails:
                    emit(1, "CUDA initialization failure with error: 35. Please check your CUDA installation")
                    raise TypeError(NULLPTR)

            def create_network(self, flags=0):
                fake.calls.append(("create_network", flags))
                return INetworkDefinition(flags)

            def create_builder_config(self):
                fake.config = IBuilderConfig()
                return fake.config

            def create_optimization_profile(self):
                return IOptimizationProfile()

            def build_serialized_network(self, network, config):
                fake.calls.append(("build_serialized_network",))
                monitor = config.progress_monitor
                if monitor is not None:
                    trampoline(monitor, "phase_start", "Building engine", None, build_steps)
                    for step in range(build_steps):
                        if on_step is not None:
                            on_step(step)
                        fake.steps_run.append(step)
                        if not trampoline(monitor, "step_complete", "Building engine", step):
                            emit(1, "Build was cancelled by the progress monitor")
                            return None
                    trampoline(monitor, "phase_finish", "Building engine")
                if build_log_error:
                    emit(1, build_log_error)
                return build_result

        @strict("ParserError")
        @_internal
        class ParserError(_Base):
            def __init__(self, text: str) -> None:
                self.text = text

            def __str__(self) -> str:
                return self.text

        @strict("OnnxParser")
        class OnnxParser(_Base):
            def __init__(self, network, logger) -> None:
                if not isinstance(network, INetworkDefinition):
                    raise TypeError("OnnxParser: network must be an INetworkDefinition")
                register(logger, "OnnxParser")
                self._errors: list[str] = []

            @property
            def num_errors(self):
                return len(self._errors)

            def parse_from_file(self, model):
                fake.calls.append(("parse_from_file", model))
                if not Path(model).is_file():
                    self._errors = [f"Failed to open {model}"]
                    return False
                self._errors = list(parse_errors)
                return not parse_errors

            def get_error(self, index):
                return ParserError(self._errors[index])

        @strict("Runtime")
        class Runtime(_Base):
            def __init__(self, logger) -> None:
                register(logger, "Runtime")
                fake.note("Runtime")
                if cuda_init_fails:
                    emit(1, "CUDA initialization failure with error: 35. Please check your CUDA installation")
                    raise TypeError(NULLPTR)

            def deserialize_cuda_engine(self, serialized_engine):
                fake.note("deserialize_cuda_engine", bytes(memoryview(serialized_engine)))
                return fake.engine

        self.ILogger, self.IProgressMonitor, self.Builder, self.Runtime, self.OnnxParser = (
            ILogger,
            IProgressMonitor,
            Builder,
            Runtime,
            OnnxParser,
        )
        self._classes = [
            ILogger,
            IProgressMonitor,
            ITimingCache,
            IOptimizationProfile,
            IBuilderConfig,
            INetworkDefinition,
            Builder,
            ParserError,
            OnnxParser,
            Runtime,
        ]
        self._Base = _Base

    def note(self, *call: Any) -> None:
        self.calls.append(call + ((self.observe(),) if self.observe else ()))

    def fake_classes(self) -> list[type]:
        return list(self._classes)

    def called(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]

    def make_engine(
        self,
        *,
        chw: tuple[int, int, int],
        profile: tuple[int, int, int],
        classes: int = 10,
        io: list[tuple[str, str, tuple[int, ...]]] | None = None,
        compute: Callable[[dict[str, int], dict[str, tuple]], None] | None = None,
        dtype: str = "FLOAT",
    ) -> Any:
        """A strict ICudaEngine with one optimisation profile (min, opt, max batch) of input
        'pixel_values' (-1, *chw); ``compute(addresses, shapes)`` runs at execute_async_v3."""
        engine_cls, context_cls = _runtime_classes(self)
        self.engine = engine_cls(chw, profile, classes, io, compute, getattr(self.DataType, dtype))
        return self.engine


def _runtime_classes(fake: StrictTrt) -> tuple[type, type]:
    cached = getattr(fake, "_runtime_cls", None)
    if cached:
        return cached
    _Base = fake._Base

    @strict("IExecutionContext")
    class IExecutionContext(_Base):
        _fake_internal_init = True

        def __init__(self, engine, strategy) -> None:
            self.engine = engine
            self.strategy = strategy
            self.calls: list[tuple] = []
            self.shapes: dict[str, tuple] = {}
            self.addresses: dict[str, int] = {}
            self.sized_for: tuple | None = None  # the input shape update_device_memory_size_for_shapes saw
            self.device_memory: tuple[int, int] | None = None  # (address, size) given with set_device_memory
            static = strategy == fake.ExecutionContextAllocationStrategy.STATIC
            self.activation_bytes = engine._activation_bytes(engine.profile[2]) if static else 0  # held for its life

        def update_device_memory_size_for_shapes(self):
            self.calls.append(("update_device_memory_size_for_shapes",))
            shape = self.shapes.get(self.engine.input_name)
            if shape is None:
                fake.emit(
                    1, "IExecutionContext::updateDeviceMemorySizeForShapes: Error Code 3: input shapes not specified"
                )
                return 0
            self.sized_for = shape
            return self.engine._activation_bytes(shape[0])

        def set_device_memory(self, memory, size):
            self.calls.append(("set_device_memory", memory, size))
            if memory % 256:
                fake.emit(1, f"IExecutionContext::setDeviceMemoryV2: Error Code 3: memory {memory:#x} is not aligned")
                return
            self.device_memory = (memory, size)
            self.activation_bytes = size

        def set_input_shape(self, name, shape):
            shape = tuple(int(d) for d in shape)
            self.calls.append(("set_input_shape", name, shape))
            low, _, high = self.engine.profile
            if (
                name != self.engine.input_name
                or len(shape) != 4
                or shape[1:] != self.engine.chw
                or not low <= shape[0] <= high
            ):
                fake.emit(
                    1,
                    f"IExecutionContext::setInputShape: Error Code 3: API Usage Error (shape {shape} outside the "
                    "profile)",
                )
                return False
            self.shapes[name] = shape
            return True

        def get_tensor_shape(self, name):
            self.calls.append(("get_tensor_shape", name))
            dims = self.engine._shape_of(name)
            batch = self.shapes.get(self.engine.input_name, (-1,))[0]
            return (batch, *dims[1:])

        def set_tensor_address(self, name, memory):
            if not isinstance(memory, int) or isinstance(memory, bool):
                raise TypeError(
                    "set_tensor_address(): incompatible function arguments: memory must be an int, got "
                    f"{type(memory).__name__}"
                )
            self.calls.append(("set_tensor_address", name, memory))
            if memory % 256:
                fake.emit(
                    1,
                    f"IExecutionContext::setTensorAddress: Error Code 3: address {memory:#x} of '{name}' is not "
                    "256-byte aligned",
                )
                return False
            self.addresses[name] = memory
            return True

        def execute_async_v3(self, stream_handle):
            self.calls.append(("execute_async_v3", stream_handle))
            if stream_handle == 0:
                fake.emit(1, "execute_async_v3 on the default stream 0: use a stream of your own")
                return False
            shape = self.shapes.get(self.engine.input_name)
            if shape is None:
                fake.emit(
                    1,
                    "IExecutionContext::enqueueV3: Error Code 3: API Usage Error (Parameter check failed, "
                    "condition: inputShapesSpecified. Not all shapes are specified.)",
                )
                return False
            if self.strategy == fake.ExecutionContextAllocationStrategy.USER_MANAGED:
                need = self.engine._activation_bytes(shape[0])
                if self.sized_for != shape or self.device_memory is None or self.device_memory[1] < need:
                    fake.emit(
                        1,
                        f"IExecutionContext::enqueueV3: Error Code 3: API Usage Error (USER_MANAGED context: "
                        f"set_device_memory of at least {need} bytes for shape {shape} is missing)",
                    )
                    return False
            if fake.on_execute is not None:
                fake.on_execute(self, stream_handle)
            missing = [n for n, _, _ in self.engine.io if n not in self.addresses]
            if missing:
                fake.emit(1, f"Neither address nor allocator is set for output tensor(s) {missing}")
                return False
            if self.engine.compute is not None:
                self.engine.compute(dict(self.addresses), dict(self.shapes))
            return self.engine.execute_ok

    @strict("ICudaEngine")
    class ICudaEngine(_Base):
        _fake_internal_init = True

        def __init__(self, chw, profile, classes, io, compute, dtype) -> None:
            self.chw, self.profile, self.compute, self.dtype = tuple(chw), tuple(profile), compute, dtype
            self.input_name = "pixel_values"
            self.io = io or [("pixel_values", "INPUT", (-1, *chw)), ("logits", "OUTPUT", (-1, classes))]
            self.live = weakref.WeakSet()
            self.contexts: list = []
            self.created = 0
            self.execute_ok = True
            self.profile_override: list | None = None
            self.bytes_per_sample = 4096  # activation memory the fake's "network" needs per batch row
            self._lock = threading.Lock()

        def _activation_bytes(self, batch):
            return int(batch) * self.bytes_per_sample

        def _shape_of(self, name):
            return next(t[2] for t in self.io if t[0] == name)

        @property
        def num_io_tensors(self):
            return len(self.io)

        def get_tensor_name(self, index):
            return self.io[index][0]

        def get_tensor_mode(self, name):
            return getattr(fake.TensorIOMode, next(t[1] for t in self.io if t[0] == name))

        def get_tensor_shape(self, name):
            return self._shape_of(name)

        def get_tensor_dtype(self, name):
            return self.dtype

        def get_tensor_profile_shape(self, name, profile_index):
            if profile_index != 0 or name != self.input_name:
                raise RuntimeError(f"no profile {profile_index} for {name}")
            if self.profile_override is not None:
                return self.profile_override
            return [(batch, *self.chw) for batch in self.profile]

        def create_execution_context(self, strategy=None):
            context = IExecutionContext(
                self, strategy if strategy is not None else fake.ExecutionContextAllocationStrategy.STATIC
            )
            fake.note("create_execution_context")
            with self._lock:
                self.created += 1
                self.live.add(context)
                self.contexts.append(context)
            return context

    fake._runtime_cls = (ICudaEngine, IExecutionContext)
    fake._classes += [ICudaEngine, IExecutionContext]
    return fake._runtime_cls


__all__ = ["NULLPTR", "StrictTrt", "check_fake_against_bindings", "signatures"]
