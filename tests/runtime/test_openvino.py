"""The OpenVINO backends (runtime/backends/openvino.py) beyond the interface the conformance test checks: the
precision each compiles at, threads safely shared, and openvino-bf16 refused in one line where the CPU has no
BF16 math (the capability list simulated)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from vitdeploy.base.errors import BackendError, MissingDependencyError
from vitdeploy.base.vocab import OPENVINO, OPENVINO_BF16
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.backends import BackendOptions, backend_unavailable_reason, open_backend, open_or_reason

pytest.importorskip("openvino")
from vitdeploy.runtime.backends import openvino as ov_backend  # noqa: E402

NO_BF16 = ("FP32", "INT8", "BIN", "EXPORT_IMPORT")  # what OpenVINO lists on an AVX2 or AVX512-VNNI-only CPU


@pytest.fixture(scope="module")
def artifacts(tiny_artifacts) -> Artifacts:
    return Artifacts.open(tiny_artifacts(seed=0))


def _batch(artifacts: Artifacts, n: int = 4) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, *artifacts.input_shape)).astype(np.float32)


def test_openvino_runs_model_onnx_at_fp32_whatever_the_cpu_default(artifacts):
    """OpenVINO's CPU default is bf16 where the CPU has BF16 math: the FP32 backend asks for f32, and gives
    ONNX Runtime's FP32 answers."""
    x = _batch(artifacts)
    ov = open_backend(OPENVINO, artifacts, BackendOptions(threads=1))
    ort = open_backend("ort", artifacts, BackendOptions(threads=1))
    try:
        assert "f32" in ov.describe() and "model.onnx" in ov.describe()
        assert np.abs(ov.run(x) - ort.run(x)).max() < 1e-4
    finally:
        ov.close()
        ort.close()


def test_one_backend_serves_many_threads(artifacts):
    backend = open_backend(OPENVINO, artifacts, BackendOptions(threads=1))
    x = _batch(artifacts, 3)
    want = backend.run(x)
    got: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: got.append(backend.run(x))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    backend.close()
    assert len(got) == 6 and all(np.array_equal(g, want) for g in got)


def test_bf16_is_refused_in_one_line_where_the_cpu_has_no_bf16_math(artifacts, monkeypatch):
    monkeypatch.setattr(ov_backend, "cpu_capabilities", lambda: NO_BF16)
    why = backend_unavailable_reason(OPENVINO_BF16, artifacts)
    assert why and "\n" not in why and "no BF16 math" in why and "FP32, INT8" in why
    with pytest.raises(BackendError, match="no BF16 math"):
        open_backend(OPENVINO_BF16, artifacts)
    opened = open_or_reason(OPENVINO_BF16, artifacts)  # what auto, validate and bench see: cannot run here
    assert opened.status == "unavailable" and opened.reason == why and opened.error is MissingDependencyError
    assert backend_unavailable_reason(OPENVINO, artifacts) is None  # FP32 runs on any CPU


def test_bf16_compiles_at_bf16_where_the_cpu_has_it(artifacts):
    if ov_backend.bf16_refusal():
        pytest.skip(f"no BF16 math here: {ov_backend.bf16_refusal()}")
    x = _batch(artifacts)
    bf16 = open_backend(OPENVINO_BF16, artifacts, BackendOptions(threads=1))
    fp32 = open_backend(OPENVINO, artifacts, BackendOptions(threads=1))
    try:
        assert "bf16" in bf16.describe()
        diff = np.abs(bf16.run(x) - fp32.run(x)).max()
        assert 0 < diff < 0.5  # another precision, close to FP32
    finally:
        bf16.close()
        fp32.close()
