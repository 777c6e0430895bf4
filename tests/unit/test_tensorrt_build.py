"""Our TensorRT build and engine-loading logic, checked with a stand-in ``tensorrt`` module.

What this checks: the calls OUR code makes (profile shapes, strongly-typed network flag on 10.x
and not on 11.x, workspace limit, optimisation level, timing cache reuse and write-back, parser
errors, failed builds leaving nothing behind, model.engine.json contents), that the json it
writes is accepted by the trt backend, and the TensorRT availability check. The fake records
calls; it does not build anything. The backend's load/run path is test_trt_backend.py.

What this is NOT: evidence that TensorRT works or that these calls are valid TensorRT. The
names are checked against the real bindings in test_tensorrt_api_names.py; a real build and
run is tests/gpu/test_tensorrt_engine.py, which needs TensorRT and a CUDA GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from vitdeploy.errors import ArtifactError, ConfigError, ExportError
from vitdeploy.export.tensorrt import EngineBuildPlan, build_engine, plan_engine_build, tensorrt_unavailable_reason
from vitdeploy.runtime.backends.base import BackendOptions
from vitdeploy.runtime.backends import trt as trt_backend
from vitdeploy.runtime.backends.trt import EngineMetadata, MachineIdentity, open_from_artifacts
from vitdeploy.runtime.cuda import GpuIdentity, cuda_index, cuda_status

MIB = 1024 * 1024
H100 = GpuIdentity(0, "NVIDIA H100 80GB HBM3", "9.0")
ENGINE_BYTES = b"serialized-engine-bytes"


# --------------------------------------------------------------------------------------------
# a recording stand-in for the tensorrt module


class FakeTrt:
    """Just enough of ``tensorrt`` for build_engine / TrtBackend; records every call in ``calls``.

    It has no BuilderFlag at all, so code that touched BuilderFlag.FP16 would fail here.
    """

    def __init__(self, version: str = "10.13.3.9", *, strongly_typed_flag: bool = True, parse_errors: tuple[str, ...] = (),
                 build_result: bytes | None = ENGINE_BYTES, build_log_error: str | None = None,
                 rejected_cache: bytes | None = None, engine: object = None) -> None:
        fake = self
        self.calls: list[tuple] = []
        self.__version__ = version
        self.NetworkDefinitionCreationFlag = SimpleNamespace(**({"STRONGLY_TYPED": 1} if strongly_typed_flag else {}))
        self.MemoryPoolType = SimpleNamespace(WORKSPACE="pool:workspace")
        self.TensorIOMode = SimpleNamespace(INPUT="mode:input", OUTPUT="mode:output")
        self.DataType = SimpleNamespace(FLOAT="dt:float", HALF="dt:half", BF16="dt:bf16")
        self.config = None

        class ILogger:
            def __init__(self) -> None:
                pass

        class TimingCache:
            def __init__(self, data: bytes) -> None:
                self.data = bytes(data)

            def serialize(self) -> bytes:
                return self.data + b"|updated"

        class Profile:
            def set_shape(self, name, shape_min, shape_opt, shape_max):
                fake.calls.append(("set_shape", name, tuple(shape_min), tuple(shape_opt), tuple(shape_max)))

        class Config:
            def __init__(self) -> None:
                self.builder_optimization_level = None
                self.cache = None

            def set_memory_pool_limit(self, pool, size):
                fake.calls.append(("set_memory_pool_limit", pool, size))

            def add_optimization_profile(self, profile):
                fake.calls.append(("add_optimization_profile",))
                return 0

            def create_timing_cache(self, data):
                fake.calls.append(("create_timing_cache", bytes(data)))
                return TimingCache(data)

            def set_timing_cache(self, cache, ignore_mismatch):
                fake.calls.append(("set_timing_cache", cache.data, ignore_mismatch))
                if rejected_cache is not None and cache.data == rejected_cache:
                    return False
                self.cache = cache
                return True

            def get_timing_cache(self):
                return self.cache

        class Network:
            pass

        class Builder:
            def __init__(self, logger) -> None:
                self.logger = logger
                fake.calls.append(("Builder",))

            def create_network(self, *args):
                fake.calls.append(("create_network", *args))
                return Network()

            def create_builder_config(self):
                fake.config = Config()
                return fake.config

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                fake.calls.append(("build_serialized_network",))
                if build_log_error:
                    self.logger.log(1, build_log_error)  # 1 = Severity.ERROR
                return build_result

        class OnnxParser:
            def __init__(self, network, logger) -> None:
                self.num_errors = 0

            def parse_from_file(self, path):
                fake.calls.append(("parse_from_file", path))
                self.num_errors = len(parse_errors)
                return not parse_errors

            def get_error(self, index):
                return _ParserError(parse_errors[index])

        class Runtime:
            def __init__(self, logger) -> None:
                fake.calls.append(("Runtime",))

            def deserialize_cuda_engine(self, data):
                fake.calls.append(("deserialize_cuda_engine", bytes(data)))
                return engine

        self.ILogger, self.Builder, self.OnnxParser, self.Runtime = ILogger, Builder, OnnxParser, Runtime

    def called(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]


class _ParserError:
    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


class FakeEngine:
    """An engine with input pixel_values (-1, 3, 32, 32) float and output logits float."""

    def __init__(self, trt: FakeTrt, chw=(3, 32, 32), io=None) -> None:
        self.io = io or [("pixel_values", trt.TensorIOMode.INPUT, (-1, *chw)), ("logits", trt.TensorIOMode.OUTPUT, (-1, 10))]
        self.num_io_tensors = len(self.io)
        self.dtype = trt.DataType.FLOAT

    def get_tensor_name(self, i):
        return self.io[i][0]

    def _find(self, name):
        return next(t for t in self.io if t[0] == name)

    def get_tensor_mode(self, name):
        return self._find(name)[1]

    def get_tensor_shape(self, name):
        return self._find(name)[2]

    def get_tensor_dtype(self, name):
        return self.dtype


# --------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.fp16.onnx"
    path.write_bytes(b"not really onnx, the fake parser does not read it")
    return path


def make_plan(onnx_file: Path, **overrides) -> EngineBuildPlan:
    settings = dict(input_name="pixel_values", chw=(3, 32, 32), min_batch=1, opt_batch=2, max_batch=4, workspace_mb=256,
                    optimization_level=2, timing_cache_path=onnx_file.parent / "cache" / "timing.cache")
    settings.update(overrides)
    return plan_engine_build(onnx_file, onnx_file.parent / "model.engine", **settings)


def build(plan: EngineBuildPlan, fake: FakeTrt) -> EngineMetadata:
    return build_engine(plan, trt=fake, device_probe=lambda: H100)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith("."))


# --------------------------------------------------------------------------------------------
# build logic


def test_profile_workspace_level_and_parse_from_file(onnx_file):
    fake = FakeTrt()
    build(make_plan(onnx_file), fake)
    assert fake.called("set_shape") == [("set_shape", "pixel_values", (1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))]
    assert fake.called("add_optimization_profile")
    assert fake.called("set_memory_pool_limit") == [("set_memory_pool_limit", "pool:workspace", 256 * MIB)]
    assert fake.config.builder_optimization_level == 2
    assert fake.called("parse_from_file") == [("parse_from_file", str(onnx_file))]  # the path, so external data resolves


def test_strongly_typed_flag_requested_on_10x(onnx_file):
    fake = FakeTrt("10.13.3.9")
    build(make_plan(onnx_file), fake)
    assert fake.called("create_network") == [("create_network", 1 << 1)]  # 1 << int(STRONGLY_TYPED)


@pytest.mark.parametrize("has_flag", [False, True], ids=["flag-absent", "flag-deprecated"])
def test_no_network_flag_on_11x(onnx_file, has_flag):
    fake = FakeTrt("11.4.0.106", strongly_typed_flag=has_flag)
    build(make_plan(onnx_file), fake)
    assert fake.called("create_network") == [("create_network",)]


def test_10x_without_strongly_typed_is_refused(onnx_file):
    fake = FakeTrt("10.0.0", strongly_typed_flag=False)
    with pytest.raises(ExportError, match="STRONGLY_TYPED"):
        build(make_plan(onnx_file), fake)
    assert not (onnx_file.parent / "model.engine").exists()


def test_tensorrt_older_than_10_is_refused(onnx_file):
    with pytest.raises(ExportError, match="8.6.1 is too old"):
        build(make_plan(onnx_file), FakeTrt("8.6.1"))


def test_missing_onnx_is_an_export_error(tmp_path):
    plan = plan_engine_build(tmp_path / "absent.onnx", tmp_path / "model.engine", chw=(3, 32, 32))
    with pytest.raises(ExportError, match="absent.onnx does not exist"):
        build(plan, FakeTrt())


def test_timing_cache_loaded_when_present_and_written_back(onnx_file):
    plan = make_plan(onnx_file)
    plan.timing_cache_path.parent.mkdir()
    plan.timing_cache_path.write_bytes(b"old-cache")
    fake = FakeTrt()
    build(plan, fake)
    assert fake.called("create_timing_cache") == [("create_timing_cache", b"old-cache")]
    assert fake.called("set_timing_cache") == [("set_timing_cache", b"old-cache", False)]
    assert plan.timing_cache_path.read_bytes() == b"old-cache|updated"
    assert leftovers(onnx_file.parent) == []


def test_timing_cache_created_when_absent(onnx_file):
    plan = make_plan(onnx_file)
    fake = FakeTrt()
    build(plan, fake)
    assert fake.called("create_timing_cache") == [("create_timing_cache", b"")]
    assert plan.timing_cache_path.read_bytes() == b"|updated"


def test_mismatched_timing_cache_is_replaced_by_a_fresh_one(onnx_file):
    plan = make_plan(onnx_file)
    plan.timing_cache_path.parent.mkdir()
    plan.timing_cache_path.write_bytes(b"cache-from-another-gpu")
    fake = FakeTrt(rejected_cache=b"cache-from-another-gpu")
    build(plan, fake)
    assert [c[1] for c in fake.called("set_timing_cache")] == [b"cache-from-another-gpu", b""]
    assert plan.timing_cache_path.read_bytes() == b"|updated"


def test_no_timing_cache_when_path_is_none(onnx_file):
    fake = FakeTrt()
    build(make_plan(onnx_file, timing_cache_path=None), fake)
    assert fake.called("create_timing_cache") == []


def test_parser_errors_collected_into_one_export_error(onnx_file):
    fake = FakeTrt(parse_errors=("In node 3 (Foo): UNSUPPORTED_NODE: no importer for Foo", "In node 7 (Bar): INVALID_NODE: bad attr"))
    with pytest.raises(ExportError) as info:
        build(make_plan(onnx_file), fake)
    text = str(info.value)
    assert "2 error(s)" in text and str(onnx_file) in text
    assert "1. In node 3 (Foo): UNSUPPORTED_NODE" in text and "2. In node 7 (Bar): INVALID_NODE" in text
    assert fake.called("build_serialized_network") == []
    assert not (onnx_file.parent / "model.engine").exists()


def test_failed_build_leaves_no_engine_json_or_temp_files(onnx_file):
    plan = make_plan(onnx_file)
    fake = FakeTrt(build_result=None, build_log_error="Could not find any implementation for node X")
    with pytest.raises(ExportError) as info:
        build(plan, fake)
    assert "failed to build" in str(info.value)
    assert "Could not find any implementation for node X" in str(info.value)  # TensorRT's own error, quoted
    assert sorted(p.name for p in onnx_file.parent.iterdir()) == [onnx_file.name]
    assert leftovers(onnx_file.parent) == []


def test_engine_and_metadata_json(onnx_file):
    plan = make_plan(onnx_file)
    meta = build(plan, FakeTrt("10.13.3.9"))
    assert (onnx_file.parent / "model.engine").read_bytes() == ENGINE_BYTES
    data = json.loads((onnx_file.parent / "model.engine.json").read_text())
    assert set(data) == {"tensorrt_version", "gpu_name", "compute_capability", "profile", "input", "chw", "precision",
                         "onnx_sha256", "workspace_mb", "optimization_level", "built"}
    assert data["tensorrt_version"] == "10.13.3.9"
    assert data["gpu_name"] == "NVIDIA H100 80GB HBM3" and data["compute_capability"] == "9.0"
    assert data["profile"] == {"min": 1, "opt": 2, "max": 4}
    assert data["input"] == "pixel_values" and data["chw"] == [3, 32, 32]
    assert data["precision"] == "fp16 (strongly typed from the FP16 ONNX graph)"
    assert data["onnx_sha256"] == hashlib.sha256(onnx_file.read_bytes()).hexdigest()
    assert data["workspace_mb"] == 256 and data["optimization_level"] == 2
    assert datetime.fromisoformat(data["built"]).tzinfo is not None
    assert EngineMetadata.load(onnx_file.parent / "model.engine.json") == meta
    assert leftovers(onnx_file.parent) == []


def test_engine_write_failure_leaves_no_engine_or_temp_file(onnx_file, monkeypatch):
    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    import vitdeploy._files as files

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(ExportError, match="cannot write .*model.engine.*No space left"):
        build(make_plan(onnx_file), FakeTrt())
    assert sorted(p.name for p in onnx_file.parent.iterdir()) == [onnx_file.name]


# --------------------------------------------------------------------------------------------
# plan validation


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (dict(min_batch=3, opt_batch=2), "min_batch"),
        (dict(opt_batch=8, max_batch=4), "opt_batch=8 is larger than max_batch"),
        (dict(min_batch=0), "min_batch"),
        (dict(max_batch=True), "max_batch"),
        (dict(optimization_level=6), "optimization_level"),
        (dict(optimization_level=-1), "optimization_level"),
        (dict(workspace_mb=0), "workspace_mb"),
        (dict(chw=(3, 32)), "chw"),
        (dict(chw=(3, 0, 32)), "chw[1]"),
        (dict(input_name=""), "input_name"),
        (dict(precision="int8"), "precision"),
    ],
)
def test_plan_validation_names_the_key(onnx_file, overrides, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        make_plan(onnx_file, **overrides)


def test_plan_values(onnx_file):
    plan = make_plan(onnx_file)
    assert plan.workspace_bytes == 256 * MIB
    assert plan.meta_path == onnx_file.parent / "model.engine.json"


# --------------------------------------------------------------------------------------------
# availability


def test_unavailable_reason_when_tensorrt_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` fails as if not installed
    assert tensorrt_unavailable_reason() == "tensorrt is not installed (pip install 'vitdeploy[tensorrt]')"


def test_unavailable_reason_when_tensorrt_does_not_import(monkeypatch):
    def broken(name):
        raise ImportError("libnvinfer.so.10: cannot open shared object file")

    monkeypatch.setattr(trt_backend, "importlib", SimpleNamespace(import_module=broken))
    reason = tensorrt_unavailable_reason()
    assert reason == "tensorrt is installed but does not import (ImportError: libnvinfer.so.10: cannot open shared object file)"


def test_unavailable_reason_without_cuda_and_one_implementation(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", SimpleNamespace(__version__="10.13.3.9"))
    monkeypatch.setattr(trt_backend, "cuda_status", lambda *a: (False, "torch 2.13.0 is a CPU-only build"))
    assert tensorrt_unavailable_reason() == "no CUDA GPU: torch 2.13.0 is a CPU-only build"
    # the registry's check is the same function
    assert trt_backend.unavailable_reason(None, BackendOptions(device="cuda")) == "no CUDA GPU: torch 2.13.0 is a CPU-only build"
    monkeypatch.setattr(trt_backend, "cuda_status", lambda *a: (True, "cuda:0 NVIDIA H100"))
    assert tensorrt_unavailable_reason() is None


def test_cuda_index_parsing():
    assert cuda_index(None) == 0 and cuda_index("cuda") == 0 and cuda_index("cuda:1") == 1 and cuda_index(2) == 2
    for bad in ("cpu", "cuda:x", "gpu", -1):
        with pytest.raises(ConfigError, match="cuda:N"):
            cuda_index(bad)


def test_cuda_status_explains_why_not_in_one_line():
    torch = pytest.importorskip("torch")
    ok, text = cuda_status()
    assert "\n" not in text
    if torch.cuda.is_available():
        assert ok and text.startswith("cuda:0 ")
    else:
        assert not ok and f"torch {torch.__version__}" in text
    ok, text = cuda_status("cpu")
    assert not ok and "not a CUDA device" in text


# --------------------------------------------------------------------------------------------
# the json build_engine writes, read back by the trt backend


def probe_as(version="10.13.3.9", gpu="NVIDIA H100 80GB HBM3", cc="9.0"):
    return lambda trt, index: MachineIdentity(version, gpu, cc)


class _NoCuda:
    """Stands in for the backend's CUDA helper: opening an engine only needs a current device."""

    def device(self, index):
        return contextlib.nullcontext()


def test_json_from_build_engine_opens_here_and_is_refused_elsewhere(onnx_file, monkeypatch):
    """build_engine's json, read back through open_from_artifacts' small artifacts interface.

    The manifest's onnx-fp16 sha256 is that of the graph the engine was built from, so it opens.
    """
    build(make_plan(onnx_file), FakeTrt("10.13.3.9"))
    folder = onnx_file.parent
    graph_sha = hashlib.sha256(onnx_file.read_bytes()).hexdigest()

    class Artifacts:
        input_shape = (3, 32, 32)

        def path(self, role):
            return folder / {"engine": "model.engine", "engine-meta": "model.engine.json"}[role]

        def has(self, role):
            return True

        def entry(self, role):
            return {"path": onnx_file.name, "sha256": graph_sha, "bytes": onnx_file.stat().st_size}

    monkeypatch.setitem(sys.modules, "tensorrt", FakeTrt(engine=FakeEngine(FakeTrt())))
    monkeypatch.setattr(trt_backend, "_TorchCuda", _NoCuda)
    monkeypatch.setattr(trt_backend, "probe_machine", probe_as())
    backend = open_from_artifacts(Artifacts(), BackendOptions(device="cuda"))
    assert backend.max_batch == 4 and backend.input_shape == (3, 32, 32)
    monkeypatch.setattr(trt_backend, "probe_machine", probe_as(version="11.4.0.106"))
    with pytest.raises(ArtifactError, match="built for TensorRT 10.13.3.9 .*rebuild"):
        open_from_artifacts(Artifacts(), BackendOptions(device="cuda"))
