"""The trt backend's load and run path, driven by a recording stand-in for tensorrt and CUDA.

What this checks: the call sequence OUR code makes — the engine/machine and engine/graph checks
before deserializing, deserialization and context/stream creation on the requested GPU,
``set_input_shape`` before the output shape is read, an address for every I/O tensor,
``execute_async_v3`` given this thread's stream handle, one context per thread, and padding a
batch below the profile's min up to min (then slicing the result back).

What this is NOT: evidence that TensorRT works, or that these calls are valid TensorRT. The fake
context "computes" logits with numpy so results can be compared; nothing here touches a GPU.
Names are checked against the real bindings in test_tensorrt_api_names.py; a real build and run
is tests/runtime/test_trt_engine_gpu.py (needs TensorRT and a CUDA GPU).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers.strict_tensorrt import StrictTrt

from vitdeploy.base.errors import ArtifactError, BackendError, ConfigError, MissingDependencyError
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
    def __init__(self, array: np.ndarray, address: int, device: int, stream: "FakeStream | None") -> None:
        self.array, self.address, self.device, self.stream = array, address, device, stream


class FakeStream:
    def __init__(self, device: int, handle: int) -> None:
        self.device, self.handle = device, handle


class FakeCuda:
    """Records the current device and stream per thread, streams and buffers; buffers live in
    ``memory``, each remembering the stream current when it was allocated or copied. A copy back
    on another stream than the buffer's, or a run on another stream than its buffers'
    (:meth:`check_run`), fails: on a GPU that is a race."""

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
            buffer = FakeBuffer(array, self._next, index, getattr(self._tls, "stream", None))
            self.memory[buffer.address] = buffer
        return buffer

    def scratch(self, nbytes: int, index: int) -> FakeBuffer:
        return self._alloc(np.zeros(nbytes, dtype=np.uint8), index)

    def check_run(self, context, stream_handle: int) -> None:
        """Every buffer bound to ``context`` (and its activation memory) was made on the run's stream."""
        used = {name: self.memory[address] for name, address in context.addresses.items()}
        if context.device_memory and context.device_memory[1]:
            used["device memory"] = self.memory[context.device_memory[0]]
        for name, buffer in used.items():
            made_on = buffer.stream.handle if buffer.stream is not None else 0
            if made_on != stream_handle:
                raise AssertionError(
                    f"stream mismatch: {name} was copied/allocated on stream {made_on:#x}, "
                    f"execute_async_v3 ran on {stream_handle:#x}"
                )

    def upload(self, batch: np.ndarray, index: int, dtype: str) -> FakeBuffer:
        return self._alloc(batch.astype(dtype).copy(), index)

    def empty(self, shape, dtype: str, index: int) -> FakeBuffer:
        return self._alloc(np.full(shape, np.nan, dtype=dtype), index)

    def address(self, buffer: FakeBuffer) -> int:
        return buffer.address

    def download(self, buffer: FakeBuffer, stream: FakeStream) -> np.ndarray:
        current = getattr(self._tls, "stream", None)
        if buffer.stream is not stream or current is not stream:
            raise AssertionError(
                f"stream mismatch: copying back {buffer.address:#x} (written on {buffer.stream}) "
                f"on {stream}, current {current}"
            )
        return buffer.array.astype(np.float32)


# --------------------------------------------------------------------------------------------
# the strict tensorrt stand-in (tests/helpers/strict_tensorrt.py), computing with the fake CUDA memory


def make_fake(
    cuda: FakeCuda, *, profile=(1, 4), io=None, version: str = H100_SXM[0], engine: bool = True, **knobs
) -> StrictTrt:
    """A strict fake tensorrt whose engine 'computes' expected_logits from FakeCuda buffers and
    notes the current CUDA device at Runtime / deserialize / context creation."""
    fake = StrictTrt(version, **knobs)
    fake.observe = lambda: cuda.current
    fake.on_execute = cuda.check_run

    def compute(addresses, shapes):
        x = cuda.memory[addresses["pixel_values"]].array
        for name, mode, _ in fake.engine.io:
            if mode == "OUTPUT":
                out = cuda.memory[addresses[name]].array
                out[...] = expected_logits(x)[:, : out.shape[1]]

    io = [(n, {"mode:input": "INPUT", "mode:output": "OUTPUT"}.get(m, m), shape) for n, m, shape in io] if io else None
    profile = (
        profile if len(profile) == 3 else (profile[0], profile[0], profile[1])
    )  # (min, max): opt = min, as Rig writes
    fake.make_engine(chw=CHW, profile=profile, classes=CLASSES, io=io, compute=compute)
    if not engine:
        fake.engine = None
    return fake


# --------------------------------------------------------------------------------------------
# helpers


def write_meta(folder: Path, **overrides) -> Path:
    data = {
        "tensorrt_version": H100_SXM[0],
        "gpu_name": H100_SXM[1],
        "compute_capability": H100_SXM[2],
        "profile": {"min": 1, "opt": 2, "max": 4},
        "input": "pixel_values",
        "chw": list(CHW),
        "precision": "fp16 (strongly typed from the FP16 ONNX graph)",
        "onnx_sha256": ONNX_SHA,
        "workspace_mb": 256,
        "optimization_level": 2,
        "built": "2025-01-01T00:00:00+00:00",
    }
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

    def __init__(
        self,
        folder: Path,
        *,
        profile=(1, 4),
        io=None,
        device="cuda",
        probe=None,
        input_shape=CHW,
        max_batch=None,
        onnx_sha256=None,
        engine_missing=False,
        contexts=None,
        **meta,
    ) -> None:
        write_meta(folder, profile={"min": profile[0], "opt": profile[0], "max": profile[1]}, **meta)
        self.cuda = FakeCuda()
        self.trt = make_fake(self.cuda, profile=profile, io=io, engine=not engine_missing)
        self.engine = self.trt.engine
        self.backend = TrtBackend(
            folder / "model.engine",
            folder / "model.engine.json",
            input_shape,
            max_batch,
            BackendOptions(device=device),
            onnx_sha256=onnx_sha256,
            contexts=contexts,
            trt=self.trt,
            probe=probe or probe_as(),
            cuda=self.cuda,
        )


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
    assert names.index("set_input_shape") < names.index(
        "get_tensor_shape"
    )  # output shape read after the input shape is set
    assert {c[1] for c in ctx.calls if c[0] == "set_tensor_address"} == {"pixel_values", "logits"}
    assert names[-1] == "execute_async_v3"
    (stream,) = rig.cuda.streams
    assert ctx.calls[-1] == ("execute_async_v3", stream.handle)


def test_every_io_tensor_gets_an_address_and_logits_is_returned(tmp_path):
    io = [
        ("pixel_values", "mode:input", (-1, *CHW)),
        ("features", "mode:output", (-1, 4)),
        ("logits", "mode:output", (-1, CLASSES)),
    ]
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


def run_in_threads(count: int, work) -> None:
    """Run ``work(i)`` on ``count`` threads started together; fail with the first error any raised."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_runs_use_separate_contexts_and_streams(tmp_path):
    rig = Rig(tmp_path, contexts=3)
    batch = batch_of(2)
    barrier = threading.Barrier(3)
    results = {}

    def work(i: int) -> None:
        barrier.wait(timeout=10)
        results[i] = rig.backend.run(batch)

    run_in_threads(3, work)
    contexts = rig.engine.contexts
    assert 1 <= len(contexts) <= 3 and rig.backend.live_contexts == len(contexts)
    assert len(rig.cuda.streams) == len(contexts)  # one stream per context
    for ctx in contexts:  # each context always executes on its own stream
        assert len({c[1] for c in ctx.calls if c[0] == "execute_async_v3"}) == 1
    for got in results.values():
        np.testing.assert_allclose(got, expected_logits(batch), rtol=1e-6)


def test_fifty_short_lived_threads_keep_live_contexts_bounded(tmp_path):
    """Thread-per-request: 50 threads each run once and exit; contexts (GPU memory each) stay <= the pool."""
    rig = Rig(tmp_path, contexts=2)
    peak = [0]

    def work(i: int) -> None:
        got = rig.backend.run(batch_of(1 + i % 4, seed=i))
        np.testing.assert_allclose(got, expected_logits(batch_of(1 + i % 4, seed=i)), rtol=1e-6)
        peak[0] = max(peak[0], rig.backend.live_contexts)

    run_in_threads(50, work)
    assert rig.engine.created <= 2 and peak[0] <= 2
    assert len(rig.engine.live) <= 2
    rig.backend.close()
    rig.engine.contexts.clear()
    import gc

    gc.collect()
    assert len(rig.engine.live) == 0  # close() lets every context go


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
    rig.engine.execute_ok = False
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
    assert rig.trt.called("deserialize_cuda_engine") == [("deserialize_cuda_engine", ENGINE_BYTES, 1)]
    assert rig.trt.called("create_execution_context") == [("create_execution_context", 1)]
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
    with pytest.raises(
        ArtifactError, match=r"NVIDIA A10G .*compute capability 8\.6.*differs in compute_capability.*rebuild"
    ):
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
    fake = make_fake(cuda, profile=(1, 2, 4))
    with pytest.raises(ArtifactError):
        TrtBackend(
            tmp_path / "model.engine",
            tmp_path / "model.engine.json",
            CHW,
            None,
            BackendOptions(),
            trt=fake,
            probe=probe_as(),
            cuda=cuda,
        )
    assert fake.calls == []


def test_refuses_engine_built_from_another_onnx_graph(tmp_path):
    other = "cd" * 32
    with pytest.raises(ArtifactError) as info:
        Rig(tmp_path, onnx_sha256=other)
    text = str(info.value)
    assert ONNX_SHA in text and other in text and "another graph" in text and "Rebuild" in text


class FakeArtifacts:
    """The FP16 engine's roles (the INT8 engine's with ``int8=True``) and its source graph's sha256."""

    input_shape = CHW

    def __init__(self, folder: Path, fp16_sha: str | None, *, int8: bool = False) -> None:
        self.folder, self.fp16_sha = folder, fp16_sha
        stem, self.source = ("model.int8", "onnx-int8-trt") if int8 else ("model", "onnx-fp16")
        role = "engine-int8" if int8 else "engine"
        self.files = {role: f"{stem}.engine", f"{role}-meta": f"{stem}.engine.json"}

    def path(self, role):
        return self.folder / self.files[role]

    def has(self, role):
        return role in self.files or (role == self.source and self.fp16_sha is not None)

    def entry(self, role):
        assert role == self.source
        return {"path": f"{role}.onnx", "sha256": self.fp16_sha, "bytes": 1}


@pytest.fixture
def registry_fakes(tmp_path, monkeypatch):
    """open_from_artifacts with the fakes installed where the registry path looks for them."""
    write_meta(tmp_path)
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "tensorrt", make_fake(cuda, profile=(1, 2, 4)))
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


def test_trt_int8_opens_model_int8_engine_built_from_the_qdq_graph(registry_fakes):
    from vitdeploy.runtime.backends import open_backend

    for name in ("model.engine", "model.engine.json"):  # the INT8 pair only
        (registry_fakes / name).rename(registry_fakes / name.replace("model.", "model.int8.", 1))
    backend = open_backend(
        "trt-int8", FakeArtifacts(registry_fakes, ONNX_SHA, int8=True), BackendOptions(device="cuda")
    )
    assert backend.name == "trt-int8" and backend.engine_path.name == "model.int8.engine" and backend.max_batch == 4
    with pytest.raises(ArtifactError, match="onnx-int8-trt graph .*built from another graph"):
        open_backend("trt-int8", FakeArtifacts(registry_fakes, "ef" * 32, int8=True), BackendOptions(device="cuda"))


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
        TrtBackend(
            tmp_path / "model.engine",
            tmp_path / "model.engine.json",
            CHW,
            None,
            BackendOptions(),
            trt=make_fake(cuda, engine=False),
            probe=probe_as(),
            cuda=cuda,
        )
    with pytest.raises(ArtifactError, match="'profile'"):
        Rig(tmp_path, profile=(8, 4))


def test_rejects_engine_whose_input_differs_from_json(tmp_path):
    io = [("images", "mode:input", (-1, *CHW)), ("logits", "mode:output", (-1, CLASSES))]
    with pytest.raises(ArtifactError, match=r"input tensor\(s\) \['images'\]"):
        Rig(tmp_path, io=io)


# --------------------------------------------------------------------------------------------
# issue 13: failures around TensorRT


def test_runtime_cuda_init_failure_is_a_backend_error_quoting_tensorrt(tmp_path):
    with pytest.raises(BackendError) as info:
        write_meta(tmp_path)
        cuda = FakeCuda()
        TrtBackend(
            tmp_path / "model.engine",
            tmp_path / "model.engine.json",
            CHW,
            None,
            BackendOptions(device="cuda"),
            trt=make_fake(cuda, profile=(1, 2, 4), cuda_init_fails=True),
            probe=probe_as(),
            cuda=cuda,
        )
    text = str(info.value)
    assert "could not create its Runtime on cuda:0" in text and "factory function returned nullptr" in text
    assert "CUDA initialization failure" in text


@pytest.mark.integration  # the demo export
def test_auto_selection_falls_back_to_the_cpu_when_tensorrt_cannot_start(demo_artifacts, monkeypatch):
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.auto_choice import cpu_candidates
    from vitdeploy.runtime.predictor import select_backend

    fake = StrictTrt(cuda_init_fails=True)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(trt_backend, "cuda_status", lambda *a: (True, "cuda:0 NVIDIA H100"))
    monkeypatch.setattr(trt_backend, "_TorchCuda", FakeCuda)
    monkeypatch.setattr(trt_backend, "_RUNTIME_PROBES", {})
    artifacts = Artifacts.open(demo_artifacts)
    claims_engine = artifacts.has
    monkeypatch.setattr(artifacts, "has", lambda role: role in ("engine", "engine-meta") or claims_engine(role))
    backend, name, why = select_backend(artifacts, BackendOptions())
    backend.close()
    assert name in cpu_candidates()  # the CPU backend this machine measured fastest
    assert "trt unavailable (TensorRT 10.13.3.9 could not create its Runtime on cuda:0" in why
    assert fake.called("Runtime") == [("Runtime",)]


def test_one_logger_per_process_so_a_second_backend_still_quotes_tensorrt(tmp_path):
    """TensorRT keeps the first logger it is given; the second backend's failure must still quote it."""
    write_meta(tmp_path)
    cuda = FakeCuda()
    fake = make_fake(cuda, profile=(1, 2, 4))
    first = TrtBackend(
        tmp_path / "model.engine",
        tmp_path / "model.engine.json",
        CHW,
        None,
        BackendOptions(device="cuda"),
        trt=fake,
        probe=probe_as(),
        cuda=cuda,
    )
    second = TrtBackend(
        tmp_path / "model.engine",
        tmp_path / "model.engine.json",
        CHW,
        None,
        BackendOptions(device="cuda"),
        trt=fake,
        probe=probe_as(),
        cuda=cuda,
    )
    assert fake.called("logger-ignored") == []  # both Runtimes were given the one process logger
    with pytest.raises(BackendError, match=r"rejected input shape .*TensorRT said: IExecutionContext::setInputShape"):
        second._run_on(second._new_state(), batch_of(9))  # beyond the profile: TensorRT logs why
    first.close()
    second.close()


def test_engine_profile_must_match_its_json(tmp_path):
    cuda = FakeCuda()
    write_meta(tmp_path, profile={"min": 1, "opt": 2, "max": 4})
    fake = make_fake(cuda, profile=(1, 2, 8))  # the engine was built for max batch 8
    with pytest.raises(ArtifactError) as info:
        TrtBackend(
            tmp_path / "model.engine",
            tmp_path / "model.engine.json",
            CHW,
            None,
            BackendOptions(device="cuda"),
            trt=fake,
            probe=probe_as(),
            cuda=cuda,
        )
    text = str(info.value)
    assert "(8, 3, 8, 8)" in text and "(4, 3, 8, 8)" in text and "model.engine.json" in text


def test_unaligned_device_address_is_a_backend_error(tmp_path):
    rig = Rig(tmp_path)
    rig.cuda._next = 0x1010  # buffers now land on 16-byte, not 256-byte, boundaries
    with pytest.raises(BackendError, match="256-byte aligned"):
        rig.backend.run(batch_of(1))


def test_torch_of_another_cuda_major_is_refused_at_open(tmp_path, monkeypatch):
    monkeypatch.setattr(trt_backend, "tensorrt_cuda_major", lambda: 13)
    write_meta(tmp_path)
    cuda = FakeCuda()
    cuda.cuda_version, cuda.torch_version = "12.8", "2.13.0+cu128"
    fake = make_fake(cuda, profile=(1, 2, 4))
    with pytest.raises(
        BackendError, match=r"CUDA 13 \(tensorrt-cu13\) but torch 2.13.0\+cu128 is built for CUDA 12.8"
    ):
        TrtBackend(
            tmp_path / "model.engine",
            tmp_path / "model.engine.json",
            CHW,
            None,
            BackendOptions(device="cuda"),
            trt=fake,
            probe=probe_as(),
            cuda=cuda,
        )
    assert fake.calls == []


def test_strict_fake_matches_the_real_bindings():
    from helpers.strict_tensorrt import check_fake_against_bindings

    for version in ("10.13.3.9", "11.4.0.106"):
        fake = make_fake(FakeCuda(), version=version)
        assert check_fake_against_bindings(fake) == []
        assert (
            int(fake.ILogger.Severity.ERROR) == 1
            and int(fake.DataType.HALF) == 1
            and int(fake.TensorIOMode.INPUT) == 1
        )
    assert int(StrictTrt("10.13.3.9").NetworkDefinitionCreationFlag.STRONGLY_TYPED) == 1
    assert int(StrictTrt("11.4.0.106").NetworkDefinitionCreationFlag.STRONGLY_TYPED) == 0


def test_strict_fake_logger_rules():
    fake = StrictTrt()

    class NoBaseInit(fake.ILogger):
        def __init__(self):
            pass

        def log(self, severity, msg):
            pass

    with pytest.raises(TypeError, match="__init__"):
        fake.Runtime(NoBaseInit())
    seen = []

    class Raising(fake.ILogger):
        def __init__(self):
            super().__init__()

        def log(self, severity, msg):
            seen.append(severity)
            raise ValueError("boom")

    fake.Runtime(Raising())
    fake.emit(1, "an error")
    assert seen == [fake.ILogger.Severity.ERROR] and isinstance(fake.swallowed[0], ValueError)
    fake.Runtime(Raising())  # a second logger is ignored: TensorRT keeps the first
    assert fake.called("logger-ignored") == [("logger-ignored", "Runtime")]


# --------------------------------------------------------------------------------------------
# activation memory per run (USER_MANAGED) and failed runs


def test_contexts_get_the_activation_memory_of_their_batch_not_the_profile_max(tmp_path):
    rig = Rig(tmp_path, profile=(1, 32))
    rig.backend.run(batch_of(1))
    (ctx,) = rig.engine.contexts
    assert ctx.strategy == rig.trt.ExecutionContextAllocationStrategy.USER_MANAGED
    per_row = rig.engine.bytes_per_sample
    assert ctx.activation_bytes == per_row  # STATIC would hold 32 rows' worth for the context's life
    names = [c[0] for c in ctx.calls]
    assert (
        names.index("set_input_shape")
        < names.index("update_device_memory_size_for_shapes")
        < names.index("set_device_memory")
        < names.index("execute_async_v3")
    )
    rig.backend.run(batch_of(5))
    assert ctx.activation_bytes == 5 * per_row  # grown for the larger batch
    allocations = len(rig.cuda.memory)
    rig.backend.run(batch_of(2))
    assert ctx.activation_bytes == 5 * per_row  # the larger buffer is reused for a smaller batch
    assert len(rig.cuda.memory) == allocations + 2  # input and logits only: no new activation buffer


def test_cuda_error_at_the_copy_back_is_a_backend_error_and_the_context_is_dropped(tmp_path):
    rig = Rig(tmp_path)
    real_download = rig.cuda.download
    failures = ["CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be reported later"]

    def download(buffer, stream):
        if failures:
            raise RuntimeError(failures.pop())  # what torch raises for an asynchronous CUDA error
        return real_download(buffer, stream)

    rig.cuda.download = download
    with pytest.raises(
        BackendError, match="CUDA failed while running model.engine on cuda:0.*illegal memory access"
    ) as info:
        rig.backend.run(batch_of(2))
    assert "\n" not in str(info.value) and isinstance(info.value.__cause__, RuntimeError)
    assert rig.backend.live_contexts == 0 and rig.engine.created == 1  # the failed context is gone
    np.testing.assert_allclose(rig.backend.run(batch_of(2)), expected_logits(batch_of(2)), rtol=1e-6)
    assert rig.engine.created == 2 and rig.backend.live_contexts == 1  # a fresh one served the next run


def test_failed_execution_drops_its_context(tmp_path):
    rig = Rig(tmp_path)
    rig.engine.execute_ok = False
    with pytest.raises(BackendError, match="execution failed"):
        rig.backend.run(batch_of(1))
    assert rig.backend.live_contexts == 0
    rig.engine.execute_ok = True
    rig.backend.run(batch_of(1))
    assert rig.engine.created == 2


def test_copies_on_another_stream_than_the_run_are_caught_by_the_fake(tmp_path):
    """The fake CUDA records each buffer's stream: copies outside the run's stream would race on a GPU."""
    rig = Rig(tmp_path)
    rig.cuda.use_stream = lambda stream: contextlib.nullcontext()  # a backend that forgot to make its stream current
    with pytest.raises(AssertionError, match="stream mismatch"):
        rig.backend.run(batch_of(1))
