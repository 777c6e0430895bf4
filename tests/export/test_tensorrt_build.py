"""Our TensorRT build and engine-loading logic, checked with a stand-in ``tensorrt`` module.

What this checks: the calls OUR code makes (profile shapes, strongly-typed network flag on 10.x
and not on 11.x, workspace limit, optimisation level, timing cache reuse and write-back, parser
errors, failed builds leaving nothing behind, model.engine.json contents), that the json it
writes is accepted by the trt backend, and the TensorRT availability check. The fake
(tests/helpers/strict_tensorrt.py) takes its signatures and enum values from the real 10.13 / 11.1
bindings and records calls; it does not build anything. The backend's load/run path is test_trt_backend.py.

What this is NOT: evidence that TensorRT works or that these calls are valid TensorRT. The
names are checked against the real bindings in test_tensorrt_api_names.py; a real build and
run is tests/runtime/test_trt_engine_gpu.py, which needs TensorRT and a CUDA GPU.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import os
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.strict_tensorrt import StrictTrt

from vitdeploy.base.errors import ArtifactError, ConfigError, ExportError
from vitdeploy.export.engine_plan import EngineBuildPlan, plan_engine_build
from vitdeploy.export.tensorrt import build_engine, tensorrt_unavailable_reason
from vitdeploy.runtime.backends import trt as trt_backend
from vitdeploy.runtime.backends.base import BackendOptions
from vitdeploy.runtime.backends.trt import EngineMetadata, MachineIdentity, open_from_artifacts
from vitdeploy.runtime.cuda import GpuIdentity, cuda_index, cuda_status

MIB = 1024 * 1024
H100 = GpuIdentity(0, "NVIDIA H100 80GB HBM3", "9.0")
ENGINE_BYTES = b"serialized-engine-bytes"


# --------------------------------------------------------------------------------------------
# the strict stand-in for the tensorrt module (tests/helpers/strict_tensorrt.py)


def FakeTrt(version: str = "10.13.3.9", *, strongly_typed_flag: bool = True, **knobs) -> StrictTrt:
    """The strict fake; ``strongly_typed_flag=False`` removes NetworkDefinitionCreationFlag.STRONGLY_TYPED
    (as in a TensorRT that predates it)."""
    fake = StrictTrt(version, **knobs)
    if not strongly_typed_flag:
        members = {m.name: m.value for m in fake.NetworkDefinitionCreationFlag if m.name != "STRONGLY_TYPED"}
        fake.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", members)
    return fake


class RecordingCuda:
    """Stands in for torch's CUDA helper: records which device was current."""

    def __init__(self, cuda_version: str | None = None) -> None:
        self.cuda_version, self.torch_version = cuda_version, "2.13.0"
        self.devices: list[int] = []

    @contextlib.contextmanager
    def device(self, index):
        self.devices.append(index)
        yield


def foreign_cache(version: str = "10.13.3.9", gpu: str = "NVIDIA A10G") -> bytes:
    return f"fake-timing-cache/{version}/{gpu}".encode() + b"\nold-entries"


# --------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.fp16.onnx"
    path.write_bytes(b"not really onnx, the fake parser does not read it")
    return path


def make_plan(onnx_file: Path, **overrides) -> EngineBuildPlan:
    settings = dict(
        input_name="pixel_values",
        chw=(3, 32, 32),
        min_batch=1,
        opt_batch=2,
        max_batch=4,
        workspace_mb=256,
        optimization_level=2,
        timing_cache_path=onnx_file.parent / "cache" / "timing.cache",
    )
    settings.update(overrides)
    return plan_engine_build(onnx_file, onnx_file.parent / "model.engine", **settings)


def build(plan: EngineBuildPlan, fake: StrictTrt, cuda: RecordingCuda | None = None, **kwargs) -> EngineMetadata:
    return build_engine(plan, trt=fake, device_probe=lambda index: H100, cuda=cuda or RecordingCuda(), **kwargs)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith("."))


# --------------------------------------------------------------------------------------------
# build logic


def test_profile_workspace_level_and_parse_from_file(onnx_file):
    fake = FakeTrt()
    build(make_plan(onnx_file), fake)
    assert fake.called("set_shape") == [("set_shape", "pixel_values", (1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))]
    assert fake.called("add_optimization_profile")
    assert fake.called("set_memory_pool_limit") == [
        ("set_memory_pool_limit", fake.MemoryPoolType.WORKSPACE, 256 * MIB)
    ]
    assert fake.config.builder_optimization_level == 2
    assert fake.called("parse_from_file") == [
        ("parse_from_file", str(onnx_file))
    ]  # the path, so external data resolves


def test_strongly_typed_flag_requested_on_10x(onnx_file):
    fake = FakeTrt("10.13.3.9")
    build(make_plan(onnx_file), fake)
    assert fake.called("create_network") == [
        ("create_network", 1 << 1)
    ]  # 1 << int(STRONGLY_TYPED), STRONGLY_TYPED = 1 in 10.13


@pytest.mark.parametrize("has_flag", [False, True], ids=["flag-absent", "flag-deprecated"])
def test_no_network_flag_on_11x(onnx_file, has_flag):
    fake = FakeTrt("11.4.0.106", strongly_typed_flag=has_flag)
    build(make_plan(onnx_file), fake)
    assert fake.called("create_network") == [("create_network", 0)]  # no flags: 11.x networks are strongly typed


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
    own = b"fake-timing-cache/10.13.3.9/NVIDIA H100 80GB HBM3\nold-entries"
    plan.timing_cache_path.write_bytes(own)
    fake = FakeTrt()
    build(plan, fake)
    assert fake.called("create_timing_cache") == [("create_timing_cache", own)]
    assert [c[3] for c in fake.called("set_timing_cache")] == [False]  # ignore_mismatch=False
    assert plan.timing_cache_path.read_bytes() == own + b"+tuned"
    assert leftovers(onnx_file.parent) == []


def test_timing_cache_created_when_absent(onnx_file):
    plan = make_plan(onnx_file)
    fake = FakeTrt()
    build(plan, fake)
    assert fake.called("create_timing_cache") == [("create_timing_cache", b"")]
    assert plan.timing_cache_path.read_bytes() == b"fake-timing-cache/10.13.3.9/NVIDIA H100 80GB HBM3\n+tuned"


def test_foreign_timing_cache_is_refused_and_replaced_by_a_fresh_one(onnx_file):
    plan = make_plan(onnx_file)
    plan.timing_cache_path.parent.mkdir()
    plan.timing_cache_path.write_bytes(foreign_cache())
    fake = FakeTrt()
    build(plan, fake)
    assert [c[1] for c in fake.called("set_timing_cache")] == [
        b"fake-timing-cache/10.13.3.9/NVIDIA A10G",
        b"fake-timing-cache/10.13.3.9/NVIDIA H100 80GB HBM3",
    ]
    assert plan.timing_cache_path.read_bytes() == b"fake-timing-cache/10.13.3.9/NVIDIA H100 80GB HBM3\n+tuned"


def test_no_timing_cache_when_path_is_none(onnx_file):
    fake = FakeTrt()
    build(make_plan(onnx_file, timing_cache_path=None), fake)
    assert fake.called("create_timing_cache") == []


def test_parser_errors_collected_into_one_export_error(onnx_file):
    fake = FakeTrt(
        parse_errors=(
            "In node 3 (Foo): UNSUPPORTED_NODE: no importer for Foo",
            "In node 7 (Bar): INVALID_NODE: bad attr",
        )
    )
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
    assert set(data) == {
        "tensorrt_version",
        "gpu_name",
        "compute_capability",
        "profile",
        "input",
        "chw",
        "precision",
        "onnx_sha256",
        "workspace_mb",
        "optimization_level",
        "built",
    }
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


@pytest.mark.parametrize("version, flags", [("10.13.3.9", 1 << 1), ("11.4.0.106", 0)])
def test_int8_engine_from_the_qdq_graph_takes_the_same_strongly_typed_path(tmp_path, version, flags):
    """Explicit quantization: INT8 comes from the graph's Q/DQ, so the calls are the FP16 engine's
    (STRONGLY_TYPED on 10.x, no flag on 11.x) and no builder flag is ever set."""
    qdq = tmp_path / "model.int8.trt.onnx"
    qdq.write_bytes(b"a Q/DQ graph, not read by the fake parser")
    plan = plan_engine_build(
        qdq,
        tmp_path / "model.int8.engine",
        chw=(3, 32, 32),
        min_batch=1,
        opt_batch=2,
        max_batch=4,
        workspace_mb=256,
        optimization_level=2,
        timing_cache_path=None,
        precision="int8",
    )
    fake = FakeTrt(version)
    meta = build(plan, fake)
    assert fake.called("create_network") == [("create_network", flags)]
    assert fake.called("parse_from_file") == [("parse_from_file", str(qdq))]
    assert not [c for c in fake.calls if "flag" in c[0].lower()]  # the strict config has no set_flag either
    data = json.loads((tmp_path / "model.int8.engine.json").read_text())
    assert data["precision"].startswith("int8 (explicit quantization") and meta.precision == data["precision"]
    assert data["onnx_sha256"] == hashlib.sha256(qdq.read_bytes()).hexdigest()
    assert (tmp_path / "model.int8.engine").read_bytes() == ENGINE_BYTES


def test_engine_write_failure_leaves_no_engine_or_temp_file(onnx_file, monkeypatch):
    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    import vitdeploy.base._files as files

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
        (dict(precision="int4"), "precision"),
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
    assert tensorrt_unavailable_reason() == f"tensorrt is not installed ({trt_backend.INSTALL_HINT})"
    assert (
        "vitdeploy[tensorrt-cu12]" in trt_backend.INSTALL_HINT
        and "vitdeploy[tensorrt-cu13]" in trt_backend.INSTALL_HINT
    )


def test_unavailable_reason_when_tensorrt_does_not_import(monkeypatch):
    def broken(name):
        raise ImportError("libnvinfer.so.10: cannot open shared object file")

    monkeypatch.setattr(trt_backend, "importlib", SimpleNamespace(import_module=broken))
    reason = tensorrt_unavailable_reason()
    assert (
        reason
        == "tensorrt is installed but does not import (ImportError: libnvinfer.so.10: cannot open shared object file)"
    )


def test_unavailable_reason_without_cuda_and_one_implementation(monkeypatch):
    fake = FakeTrt()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(trt_backend, "cuda_status", lambda *a: (False, "torch 2.13.0 is a CPU-only build"))
    assert tensorrt_unavailable_reason() == "no CUDA GPU: torch 2.13.0 is a CPU-only build"
    # the registry's check is the same function
    assert (
        trt_backend.unavailable_reason(None, BackendOptions(device="cuda"))
        == "no CUDA GPU: torch 2.13.0 is a CPU-only build"
    )
    monkeypatch.setattr(trt_backend, "cuda_status", lambda *a: (True, "cuda:0 NVIDIA H100"))
    monkeypatch.setattr(trt_backend, "_TorchCuda", RecordingCuda)
    monkeypatch.setattr(trt_backend, "_RUNTIME_PROBES", {})
    assert tensorrt_unavailable_reason() is None
    assert fake.called("Runtime") == [("Runtime",)]  # a Runtime really starts
    assert tensorrt_unavailable_reason() is None and len(fake.called("Runtime")) == 1  # once per process and device


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

    runtime_fake = FakeTrt()
    runtime_fake.make_engine(chw=(3, 32, 32), profile=(1, 2, 4))
    monkeypatch.setitem(sys.modules, "tensorrt", runtime_fake)
    monkeypatch.setattr(trt_backend, "_TorchCuda", RecordingCuda)
    monkeypatch.setattr(trt_backend, "probe_machine", probe_as())
    backend = open_from_artifacts(Artifacts(), BackendOptions(device="cuda"))
    assert backend.max_batch == 4 and backend.input_shape == (3, 32, 32)
    monkeypatch.setattr(trt_backend, "probe_machine", probe_as(version="11.4.0.106"))
    with pytest.raises(ArtifactError, match="built for TensorRT 10.13.3.9 .*rebuild"):
        open_from_artifacts(Artifacts(), BackendOptions(device="cuda"))


# --------------------------------------------------------------------------------------------
# failure modes around the build (issue 13)


def test_builder_cuda_init_failure_is_an_export_error_quoting_tensorrt(onnx_file):
    fake = FakeTrt(cuda_init_fails=True)
    with pytest.raises(ExportError) as info:
        build(make_plan(onnx_file), fake)
    text = str(info.value)
    assert "could not create its Builder on cuda:0" in text and "factory function returned nullptr" in text
    assert "CUDA initialization failure with error: 35" in text  # TensorRT's own logged error, quoted
    assert sorted(p.name for p in onnx_file.parent.iterdir()) == [onnx_file.name]


@pytest.mark.parametrize("kind", ["directory", "read-only folder"])
def test_unwritable_timing_cache_keeps_the_finished_engine_and_json(onnx_file, kind, caplog):
    plan = make_plan(onnx_file)
    if kind == "directory":
        plan.timing_cache_path.mkdir(parents=True)  # the cache path is a folder
    else:
        plan.timing_cache_path.parent.mkdir()
        plan.timing_cache_path.parent.chmod(0o500)
    try:
        with caplog.at_level(logging.WARNING):
            meta = build(plan, FakeTrt())
    finally:
        plan.timing_cache_path.parent.chmod(0o700)
    assert plan.engine_path.read_bytes() == ENGINE_BYTES
    assert EngineMetadata.load(plan.meta_path) == meta
    if kind == "directory" or os.geteuid() != 0:  # root writes into a read-only folder anyway
        assert any("timing cache not saved" in r.getMessage() for r in caplog.records)


def test_engine_and_json_are_written_as_a_pair(onnx_file, monkeypatch):
    """A json that cannot be put in place takes the new engine with it: never one without the other."""
    import vitdeploy.export.tensorrt as stage

    real_replace = os.replace

    def refuse_json(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    plan = make_plan(onnx_file)
    plan.meta_path.write_text("{}")  # an old json from an earlier build
    plan.engine_path.write_bytes(b"old engine")
    monkeypatch.setattr(stage.os, "replace", refuse_json)
    with pytest.raises(ExportError, match="No space left"):
        build(plan, FakeTrt())
    assert not plan.engine_path.exists() and not plan.meta_path.exists()
    assert leftovers(onnx_file.parent) == []


def test_ctrl_c_inside_a_tensorrt_callback_cancels_the_build(onnx_file):
    """TensorRT swallows exceptions raised in its callbacks; our logger turns Ctrl-C into a cancel
    that the progress monitor hands to TensorRT (step_complete returns False)."""

    class CtrlC(logging.Handler):
        def emit(self, record):
            if "step 2 done" in record.getMessage():
                raise KeyboardInterrupt

    handler = CtrlC(level=logging.DEBUG)
    trt_log = logging.getLogger(trt_backend.__name__)
    trt_log.addHandler(handler)
    old_level = trt_log.level
    trt_log.setLevel(logging.DEBUG)
    fake = FakeTrt(build_steps=5, on_step=lambda step: fake.emit(2, f"step {step} done"))
    shown: list[str] = []
    try:
        with pytest.raises(KeyboardInterrupt):
            build(make_plan(onnx_file), fake, progress=shown.append)
    finally:
        trt_log.removeHandler(handler)
        trt_log.setLevel(old_level)
    assert fake.swallowed == []  # nothing reached TensorRT's catch-all
    assert shown[0] == "Building engine (0/5)" and "Building engine (3/5)" in shown
    assert "Building engine (4/5)" not in shown  # stopped at the step after Ctrl-C
    assert sorted(p.name for p in onnx_file.parent.iterdir()) == [onnx_file.name]


def test_build_runs_on_probes_and_records_the_configured_gpu(onnx_file):
    plan = make_plan(onnx_file, device="cuda:1")
    assert plan.device == 1
    cuda, probed = RecordingCuda(), []
    second = GpuIdentity(1, "NVIDIA L4", "8.9")
    meta = build_engine(plan, trt=FakeTrt(), device_probe=lambda index: probed.append(index) or second, cuda=cuda)
    assert cuda.devices == [1] and probed == [1]
    assert (meta.gpu_name, meta.compute_capability) == ("NVIDIA L4", "8.9")


def test_cuda_major_of_tensorrt_and_torch_must_match(onnx_file, monkeypatch):
    from vitdeploy.runtime.backends.trt import cuda_major_mismatch

    assert cuda_major_mismatch(12, "12.8") is None and cuda_major_mismatch(13, "13.0") is None
    assert cuda_major_mismatch(None, "13.0") is None and cuda_major_mismatch(12, None) is None
    why = cuda_major_mismatch(12, "13.0", "2.13.0")
    assert "CUDA 12 (tensorrt-cu12)" in why and "torch 2.13.0 is built for CUDA 13.0" in why
    monkeypatch.setattr(trt_backend, "tensorrt_cuda_major", lambda: 12)
    import vitdeploy.export.tensorrt as stage

    monkeypatch.setattr(stage, "tensorrt_cuda_major", lambda: 12)
    fake = FakeTrt()
    with pytest.raises(ExportError, match="tensorrt-cu12.*CUDA 13.0"):
        build(make_plan(onnx_file), fake, cuda=RecordingCuda(cuda_version="13.0"))
    assert fake.calls == []  # refused before TensorRT was touched


def test_profile_with_opt_above_max_is_refused_by_tensorrt_itself(onnx_file):
    """The strict fake raises like TensorRT's set_shape; the plan check catches it first anyway."""
    fake = FakeTrt()
    profile = fake.Builder(trt_backend.trt_logger(fake)).create_optimization_profile()
    with pytest.raises(RuntimeError, match="opt is inconsistent"):
        profile.set_shape("pixel_values", (4, 3, 8, 8), (2, 3, 8, 8), (8, 3, 8, 8))
    with pytest.raises(TypeError, match="incompatible function arguments"):
        profile.set_shape("pixel_values", (1, 3, 8, 8), (2, 3, 8, 8), maximum=(8, 3, 8, 8))


@pytest.mark.parametrize("version", ["10.13.3.9", "11.4.0.106"])
def test_build_lets_the_runtime_size_activation_memory_per_shape(onnx_file, version):
    """RUNTIME_ACTIVATION_RESIZE_10_10 (opt-in on 10.13 and 11.x) lets the trt backend's USER_MANAGED
    contexts get only what their batch needs from update_device_memory_size_for_shapes()."""
    fake = FakeTrt(version)
    build(make_plan(onnx_file), fake)
    assert fake.called("set_preview_feature") == [
        ("set_preview_feature", fake.PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10, True)
    ]
