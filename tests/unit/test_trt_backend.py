"""The trt backend's load and run path, driven by a recording stand-in for tensorrt and CUDA.

What this checks: the call sequence OUR code makes — the engine/machine and engine/graph checks
before deserializing, deserialization and context/stream creation on the requested GPU,
``set_input_shape`` before the output shape is read, an address for every I/O tensor,
``execute_async_v3`` given this thread's stream handle, one context per thread, and padding a
batch below the profile's min up to min (then slicing the result back).

What this is NOT: evidence that TensorRT works, or that these calls are valid TensorRT. The fake
context "computes" logits with numpy so results can be compared; nothing here touches a GPU.
Names are checked against the real bindings in test_tensorrt_api_names.py; a real build and run
is tests/gpu/test_tensorrt_engine.py (needs TensorRT and a CUDA GPU).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vitdeploy.errors import ArtifactError, BackendError, ConfigError, MissingDependencyError
from vitdeploy.runtime.backends import trt as trt_backend
from vitdeploy.runtime.backends.base import BackendOptions
from vitdeploy.runtime.backends.trt import MachineIdentity, TrtBackend, open_from_artifacts

CHW = (3, 8, 8)
CLASSES = 10
ENGINE_BYTES = b"serialized-engine-bytes"
ONNX_SHA = "ab" * 32
H100_SXM = ("10.13.3.9", "NVIDIA H100 80GB HBM3", "9.0")


def expected_logits(batch: np.ndarray) -> np.ndarray:
    """What the fake engine computes: row mean times (1..10), per row independent."""
    return batch.reshape(batch.shape[0], -1).mean(axis=1, keepdims=True) * np.arange(1, CLASSES + 1, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# fake CUDA (replaces _TorchCuda)


class FakeBuffer:
    def __init__(self, array: np.ndarray, address: int, device: int) -> None:
        self.array, self.address, self.device = array, address, device


class FakeStream:
    def __init__(self, device: int, handle: int) -> None:
        self.device, self.handle = device, handle


class FakeCuda:
    """Records the current device per thread, streams and buffers; buffers live in ``memory``."""

    def __init__(self) -> None:
        self._tls = threading.local()
        self._lock = threading.Lock()
        self.memory: dict[int, FakeBuffer] = {}
        self.streams: list[FakeStream] = []
        self._next = 0x1000

    @property
    def current(self) -> int | None:
        stack = getattr(self._tls, "devices", [])
        return stack[-1] if stack else None

    @contextlib.contextmanager
    def device(self, index: int):
        self._tls.devices = [*getattr(self._tls, "devices", []), index]
        try:
            yield
        finally:
            self._tls.devices = self._tls.devices[:-1]

    def new_stream(self, index: int) -> FakeStream:
        with self._lock:
            stream = FakeStream(index, 0x5000 + len(self.streams))
            self.streams.append(stream)
        return stream

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream):
        self._tls.stream = stream
        try:
            yield
        finally:
            self._tls.stream = None

    def stream_handle(self, stream: FakeStream) -> int:
        return stream.handle

    def _alloc(self, array: np.ndarray, index: int) -> FakeBuffer:
        assert self.current == index, "device buffer allocated with another GPU current"
        with self._lock:
            self._next += 0x100
            buffer = FakeBuffer(array, self._next, index)
            self.memory[buffer.address] = buffer
        return buffer

    def upload(self, batch: np.ndarray, index: int, dtype: str) -> FakeBuffer:
        return self._alloc(batch.astype(dtype).copy(), index)

    def empty(self, shape, dtype: str, index: int) -> FakeBuffer:
        return self._alloc(np.full(shape, np.nan, dtype=dtype), index)

    def address(self, buffer: FakeBuffer) -> int:
        return buffer.address

    def download(self, buffer: FakeBuffer, stream: FakeStream) -> np.ndarray:
        return buffer.array.astype(np.float32)


# --------------------------------------------------------------------------------------------
# fake tensorrt


class FakeContext:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.calls: list[tuple] = []
        self.shape: tuple[int, ...] | None = None
        self.addresses: dict[str, int] = {}
        self.execute_ok = True

    def set_input_shape(self, name, shape):
        self.calls.append(("set_input_shape", name, tuple(shape)))
        low, high = self.engine.profile
        if not low <= shape[0] <= high:
            return False
        self.shape = tuple(shape)
        return True

    def get_tensor_shape(self, name):
        self.calls.append(("get_tensor_shape", name))
        dims = self.engine.shape_of(name)
        return (self.shape[0] if self.shape else -1, *dims[1:])

    def set_tensor_address(self, name, address):
        self.calls.append(("set_tensor_address", name, address))
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream_handle):
        self.calls.append(("execute_async_v3", stream_handle))
        cuda = self.engine.cuda
        x = cuda.memory[self.addresses["pixel_values"]].array
        for name, mode, _ in self.engine.io:
            if mode == "mode:output":
                out = cuda.memory[self.addresses[name]].array
                out[...] = expected_logits(x)[:, : out.shape[1]]
        return self.execute_ok


class FakeEngine:
    def __init__(self, cuda: FakeCuda, profile=(1, 4), io=None) -> None:
        self.cuda = cuda
        self.profile = profile
        self.io = io or [("pixel_values", "mode:input", (-1, *CHW)), ("logits", "mode:output", (-1, CLASSES))]
        self.num_io_tensors = len(self.io)
        self.contexts: list[FakeContext] = []
        self.context_devices: list[int | None] = []

    def get_tensor_name(self, i):
        return self.io[i][0]

    def shape_of(self, name):
        return next(t[2] for t in self.io if t[0] == name)

    def get_tensor_mode(self, name):
        return next(t[1] for t in self.io if t[0] == name)

    def get_tensor_shape(self, name):
        return self.shape_of(name)

    def get_tensor_dtype(self, name):
        return "dt:float"

    def create_execution_context(self):
        context = FakeContext(self)
        self.contexts.append(context)
        self.context_devices.append(self.cuda.current)
        return context


class FakeTrt:
    """Just enough of ``tensorrt`` for TrtBackend; records the current GPU at each runtime call."""

    def __init__(self, cuda: FakeCuda, engine: FakeEngine | None, version: str = H100_SXM[0]) -> None:
        fake = self
        self.__version__ = version
        self.TensorIOMode = SimpleNamespace(INPUT="mode:input", OUTPUT="mode:output")
        self.DataType = SimpleNamespace(FLOAT="dt:float", HALF="dt:half", BF16="dt:bf16")
        self.calls: list[tuple] = []

        class ILogger:
            def __init__(self) -> None:
                pass

        class Runtime:
            def __init__(self, logger) -> None:
                fake.calls.append(("Runtime", cuda.current))

            def deserialize_cuda_engine(self, data):
                fake.calls.append(("deserialize_cuda_engine", cuda.current, bytes(data)))
                return engine

        self.ILogger, self.Runtime = ILogger, Runtime

    def called(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]


# --------------------------------------------------------------------------------------------
# helpers


def write_meta(folder: Path, **overrides) -> Path:
    data = {"tensorrt_version": H100_SXM[0], "gpu_name": H100_SXM[1], "compute_capability": H100_SXM[2],
            "profile": {"min": 1, "opt": 2, "max": 4}, "input": "pixel_values", "chw": list(CHW),
            "precision": "fp16 (strongly typed from the FP16 ONNX graph)", "onnx_sha256": ONNX_SHA, "workspace_mb": 256,
            "optimization_level": 2, "built": "2025-01-01T00:00:00+00:00"}
    data.update(overrides)
    path = folder / "model.engine.json"
    path.write_text(json.dumps(data))
    (folder / "model.engine").write_bytes(ENGINE_BYTES)
    return path


def probe_as(version=H100_SXM[0], gpu=H100_SXM[1], cc=H100_SXM[2], seen: list | None = None):
    def probe(trt, index):
        if seen is not None:
            seen.append(index)
        return MachineIdentity(version, gpu, cc)

    return probe


class Rig:
    """A backend over fakes, with the fakes at hand."""

    def __init__(self, folder: Path, *, profile=(1, 4), io=None, device="cuda", probe=None, input_shape=CHW,
                 max_batch=None, onnx_sha256=None, engine_missing=False, **meta) -> None:
        write_meta(folder, profile={"min": profile[0], "opt": profile[0], "max": profile[1]}, **meta)
        self.cuda = FakeCuda()
        self.engine = FakeEngine(self.cuda, profile, io)
        self.trt = FakeTrt(self.cuda, None if engine_missing else self.engine)
        self.backend = TrtBackend(folder / "model.engine", folder / "model.engine.json", input_shape, max_batch,
                                  BackendOptions(device=device), onnx_sha256=onnx_sha256, trt=self.trt,
                                  probe=probe or probe_as(), cuda=self.cuda)


def batch_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *CHW)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# the run path


def test_call_sequence_of_one_run(tmp_path):
    rig = Rig(tmp_path)
    batch = batch_of(3)
    got = rig.backend.run(batch)
    np.testing.assert_allclose(got, expected_logits(batch), rtol=1e-6)
    assert got.dtype == np.float32 and got.shape == (3, CLASSES)
    (ctx,) = rig.engine.contexts
    names = [c[0] for c in ctx.calls]
    assert ctx.calls[0] == ("set_input_shape", "pixel_values", (3, *CHW))
    assert names.index("set_input_shape") < names.index("get_tensor_shape")  # output shape read after the input shape is set
    assert {c[1] for c in ctx.calls if c[0] == "set_tensor_address"} == {"pixel_values", "logits"}
    assert names[-1] == "execute_async_v3"
    (stream,) = rig.cuda.streams
    assert ctx.calls[-1] == ("execute_async_v3", stream.handle)


def test_every_io_tensor_gets_an_address_and_logits_is_returned(tmp_path):
    io = [("pixel_values", "mode:input", (-1, *CHW)), ("features", "mode:output", (-1, 4)), ("logits", "mode:output", (-1, CLASSES))]
    rig = Rig(tmp_path, io=io)
    batch = batch_of(2)
    got = rig.backend.run(batch)
    assert got.shape == (2, CLASSES)
    np.testing.assert_allclose(got, expected_logits(batch), rtol=1e-6)
    (ctx,) = rig.engine.contexts
    addressed = [c[1] for c in ctx.calls if c[0] == "set_tensor_address"]
    assert sorted(addressed) == ["features", "logits", "pixel_values"]
    assert len({c[2] for c in ctx.calls if c[0] == "set_tensor_address"}) == 3  # three distinct buffers


def test_context_is_reused_within_a_thread(tmp_path):
    rig = Rig(tmp_path)
    rig.backend.run(batch_of(1))
    rig.backend.run(batch_of(2))
    assert len(rig.engine.contexts) == 1 and len(rig.cuda.streams) == 1


def test_each_thread_gets_its_own_context_and_stream(tmp_path):
    rig = Rig(tmp_path)
    batch = batch_of(2)
    barrier = threading.Barrier(3)
    results, errors = {}, []

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = rig.backend.run(batch)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    contexts = rig.engine.contexts
    assert len(contexts) == 3 and len({id(c) for c in contexts}) == 3
    assert len(rig.backend._states) == 3
    assert len({s.handle for s in rig.cuda.streams}) == 3
    # each context executed once, on its own thread's stream
    handles = [next(c[1] for c in ctx.calls if c[0] == "execute_async_v3") for ctx in contexts]
    assert sorted(handles) == sorted(s.handle for s in rig.cuda.streams)
    for got in results.values():
        np.testing.assert_allclose(got, expected_logits(batch), rtol=1e-6)


@pytest.mark.parametrize("n", [1, 3])
def test_batch_below_profile_min_is_padded_and_sliced(tmp_path, n):
    rig = Rig(tmp_path, profile=(4, 8))
    batch = batch_of(n, seed=n)
    got = rig.backend.run(batch)
    (ctx,) = rig.engine.contexts
    assert [c for c in ctx.calls if c[0] == "set_input_shape"] == [("set_input_shape", "pixel_values", (4, *CHW))]
    assert got.shape == (n, CLASSES)
    np.testing.assert_allclose(got, expected_logits(batch), rtol=1e-6)


def test_split_remainder_below_min_is_padded(tmp_path):
    rig = Rig(tmp_path, profile=(3, 4))
    batch = batch_of(5)  # split by BackendBase into 4 + 1; the 1 is padded to 3
    got = rig.backend.run(batch)
    (ctx,) = rig.engine.contexts
    assert [c[2][0] for c in ctx.calls if c[0] == "set_input_shape"] == [4, 3]
    np.testing.assert_allclose(got, expected_logits(batch), rtol=1e-6)


def test_failed_execution_is_a_backend_error(tmp_path):
    rig = Rig(tmp_path)
    rig.backend.run(batch_of(1))
    rig.engine.contexts[0].execute_ok = False
    with pytest.raises(BackendError, match="execution failed for a batch of 2"):
        rig.backend.run(batch_of(2))


def test_closed_backend_refuses_to_run(tmp_path):
    rig = Rig(tmp_path)
    rig.backend.close()
    with pytest.raises(BackendError, match="closed"):
        rig.backend.run(batch_of(1))


# --------------------------------------------------------------------------------------------
# the chosen GPU


def test_deserialize_contexts_and_buffers_on_the_requested_gpu(tmp_path):
    seen: list[int] = []
    rig = Rig(tmp_path, device="cuda:1", probe=probe_as(seen=seen))
    rig.backend.run(batch_of(2))
    assert seen == [1]
    assert rig.trt.called("Runtime") == [("Runtime", 1)]
    assert rig.trt.called("deserialize_cuda_engine") == [("deserialize_cuda_engine", 1, ENGINE_BYTES)]
    assert rig.engine.context_devices == [1]
    assert [s.device for s in rig.cuda.streams] == [1]
    assert {b.device for b in rig.cuda.memory.values()} == {1}  # FakeCuda also asserts device 1 was current


def test_cpu_device_means_cuda_0(tmp_path):
    rig = Rig(tmp_path, device="cpu")
    assert rig.trt.called("Runtime") == [("Runtime", 0)]


# --------------------------------------------------------------------------------------------
# engine / machine / graph checks (before deserializing)


def test_refuses_engine_from_another_tensorrt_version(tmp_path):
    with pytest.raises(ArtifactError) as info:
        Rig(tmp_path, tensorrt_version="10.8.0.43")
    text = str(info.value)
    assert "TensorRT 10.8.0.43" in text and "TensorRT 10.13.3.9" in text and "tensorrt_version" in text
    assert "rebuild it with `vitdeploy export` on this machine" in text


def test_refuses_engine_for_another_compute_capability(tmp_path):
    with pytest.raises(ArtifactError, match=r"NVIDIA A10G .*compute capability 8\.6.*differs in compute_capability.*rebuild"):
        Rig(tmp_path, probe=probe_as(gpu="NVIDIA A10G", cc="8.6"))


def test_same_compute_capability_other_gpu_name_opens_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=trt_backend.__name__):
        rig = Rig(tmp_path, probe=probe_as(gpu="NVIDIA H100 PCIe", cc="9.0"))
    assert rig.trt.called("deserialize_cuda_engine")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("NVIDIA H100 80GB HBM3" in w and "NVIDIA H100 PCIe" in w for w in warnings), warnings


def test_same_gpu_opens_without_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=trt_backend.__name__):
        Rig(tmp_path)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_refused_engine_is_never_deserialized(tmp_path):
    write_meta(tmp_path, tensorrt_version="11.4.0.106")
    cuda = FakeCuda()
    fake = FakeTrt(cuda, FakeEngine(cuda))
    with pytest.raises(ArtifactError):
        TrtBackend(tmp_path / "model.engine", tmp_path / "model.engine.json", CHW, None, BackendOptions(),
                   trt=fake, probe=probe_as(), cuda=cuda)
    assert fake.calls == []


def test_refuses_engine_built_from_another_onnx_graph(tmp_path):
    other = "cd" * 32
    with pytest.raises(ArtifactError) as info:
        Rig(tmp_path, onnx_sha256=other)
    text = str(info.value)
    assert ONNX_SHA in text and other in text and "another graph" in text and "Rebuild" in text


class FakeArtifacts:
    input_shape = CHW

    def __init__(self, folder: Path, fp16_sha: str | None) -> None:
        self.folder, self.fp16_sha = folder, fp16_sha

    def path(self, role):
        return self.folder / {"engine": "model.engine", "engine-meta": "model.engine.json"}[role]

    def has(self, role):
        return role in ("engine", "engine-meta") or (role == "onnx-fp16" and self.fp16_sha is not None)

    def entry(self, role):
        assert role == "onnx-fp16"
        return {"path": "model.fp16.onnx", "sha256": self.fp16_sha, "bytes": 1}


@pytest.fixture
def registry_fakes(tmp_path, monkeypatch):
    """open_from_artifacts with the fakes installed where the registry path looks for them."""
    write_meta(tmp_path)
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "tensorrt", FakeTrt(cuda, FakeEngine(cuda)))
    monkeypatch.setattr(trt_backend, "probe_machine", probe_as())
    monkeypatch.setattr(trt_backend, "_TorchCuda", lambda: cuda)
    return tmp_path


def test_open_from_artifacts_checks_the_manifest_onnx_fp16_sha(registry_fakes):
    backend = open_from_artifacts(FakeArtifacts(registry_fakes, ONNX_SHA), BackendOptions(device="cuda"))
    assert backend.max_batch == 4
    with pytest.raises(ArtifactError, match="built from another graph"):
        open_from_artifacts(FakeArtifacts(registry_fakes, "ef" * 32), BackendOptions(device="cuda"))


def test_open_from_artifacts_without_onnx_fp16_skips_the_graph_check(registry_fakes):
    assert open_from_artifacts(FakeArtifacts(registry_fakes, None), BackendOptions(device="cuda")).max_batch == 4


# --------------------------------------------------------------------------------------------
# other load-time errors


def test_backend_needs_tensorrt_before_anything_else(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail even where it is installed
    with pytest.raises(MissingDependencyError, match="tensorrt"):
        TrtBackend(tmp_path / "absent.engine", tmp_path / "absent.engine.json", CHW, None, BackendOptions())


def test_reports_undeserializable_engine(tmp_path):
    with pytest.raises(ArtifactError, match="could not deserialize"):
        Rig(tmp_path, engine_missing=True)


def test_opens_with_profile_max_batch(tmp_path):
    backend = Rig(tmp_path).backend
    assert backend.max_batch == 4 and backend.input_shape == CHW
    assert "TensorRT 10.13.3.9" in backend.describe()


def test_rejects_max_batch_beyond_profile(tmp_path):
    with pytest.raises(ConfigError, match="max_batch=8"):
        Rig(tmp_path, max_batch=8)


def test_rejects_other_input_shape(tmp_path):
    with pytest.raises(ArtifactError, match=r"\(N, 3, 8, 8\).*\(N, 3, 64, 64\)"):
        Rig(tmp_path, input_shape=(3, 64, 64))


def test_missing_or_broken_json(tmp_path):
    cuda = FakeCuda()
    with pytest.raises(ArtifactError, match="model.engine.json is missing"):
        TrtBackend(tmp_path / "model.engine", tmp_path / "model.engine.json", CHW, None, BackendOptions(),
                   trt=FakeTrt(cuda, None), probe=probe_as(), cuda=cuda)
    with pytest.raises(ArtifactError, match="'profile'"):
        Rig(tmp_path, profile=(8, 4))


def test_rejects_engine_whose_input_differs_from_json(tmp_path):
    io = [("images", "mode:input", (-1, *CHW)), ("logits", "mode:output", (-1, CLASSES))]
    with pytest.raises(ArtifactError, match=r"input tensor\(s\) \['images'\]"):
        Rig(tmp_path, io=io)
