"""A real TensorRT build and run of the shipped demo model's model.fp16.onnx (and of its INT8 Q/DQ graph,
model.int8.trt.onnx), compared with torch eager.

Needs TensorRT and a CUDA GPU; skips with the reason where either is missing. The engine is
built from the very file users get: the demo model exported by `vitdeploy export` (ONNX, then
the FP16 graph with float32 I/O and LayerNorm kept float32), so a GPU run tests what ships. The
comparison uses the project's FP16 validation threshold against torch eager on the same weights.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from vitdeploy.export.engine_plan import plan_engine_build
from vitdeploy.export.tensorrt import build_engine, tensorrt_unavailable_reason
from vitdeploy.runtime.backends.base import BackendOptions
from vitdeploy.runtime.backends.trt import TrtBackend

pytestmark = [pytest.mark.integration, pytest.mark.gpu, pytest.mark.tensorrt]

CHW = (3, 32, 32)  # the demo model's input
TOLERANCE = 0.1  # max abs logit difference vs torch eager: validation.fp16.max_abs_diff


@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    reason = tensorrt_unavailable_reason()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("torch")
    from vitdeploy.demo import DEMO_DIR as DEMO_MODEL_DIR
    from vitdeploy.model.checkpoints import load_checkpoint

    artifacts = request.getfixturevalue("demo_artifacts")  # the shipped demo model, exported (engine skipped)
    model = load_checkpoint(DEMO_MODEL_DIR).model.eval()
    folder = tmp_path_factory.mktemp("trt")
    plan = plan_engine_build(
        artifacts / "model.fp16.onnx",
        folder / "model.engine",
        input_name="pixel_values",
        chw=CHW,
        min_batch=1,
        opt_batch=2,
        max_batch=4,
        workspace_mb=512,
        optimization_level=1,
        timing_cache_path=folder / "timing.cache",
        precision="fp16",
    )
    meta = build_engine(plan)
    return model, plan, meta


def eager(model, batch: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(batch)).numpy()


def test_engine_json_and_timing_cache_written(built):
    import tensorrt
    import torch

    _, plan, meta = built
    assert plan.engine_path.stat().st_size > 0
    data = json.loads(plan.meta_path.read_text())
    assert data["tensorrt_version"] == tensorrt.__version__ == meta.tensorrt_version
    major, minor = torch.cuda.get_device_capability(0)
    assert data["compute_capability"] == f"{major}.{minor}"
    assert data["profile"] == {"min": 1, "opt": 2, "max": 4}
    assert plan.timing_cache_path.stat().st_size > 0


@pytest.mark.parametrize("batch_size", [1, 3])
def test_engine_matches_torch_eager(built, batch_size):
    model, plan, _ = built
    batch = np.random.default_rng(batch_size).standard_normal((batch_size, *CHW)).astype(np.float32)
    with TrtBackend(plan.engine_path, plan.meta_path, CHW, None, BackendOptions(device="cuda")) as backend:
        assert backend.max_batch == 4
        got = backend.run(batch)
    want = eager(model, batch)
    assert got.dtype == np.float32 and got.shape == want.shape == (batch_size, 10)
    assert float(np.abs(got - want).max()) <= TOLERANCE


def test_batches_beyond_the_profile_are_split_and_threads_share_a_bounded_pool(built):
    model, plan, _ = built
    batch = np.random.default_rng(7).standard_normal((6, *CHW)).astype(np.float32)  # > profile max 4
    want = eager(model, batch)
    backend = TrtBackend(plan.engine_path, plan.meta_path, CHW, None, BackendOptions(device="cuda"))
    barrier = threading.Barrier(3)
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=60)  # all three alive at once: none can inherit another's state
            results[i] = backend.run(batch)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live = backend.live_contexts
    backend.close()
    assert not errors, errors
    assert len(results) == 3
    assert 1 <= live <= 2, f"expected at most the pool's 2 execution contexts, got {live}"
    for got in results.values():
        assert float(np.abs(got - want).max()) <= TOLERANCE


def test_batch_below_the_profile_min_is_padded(built, tmp_path):
    """An engine whose profile min is 2 still answers a batch of 1 (padded, then sliced)."""
    model, plan, _ = built
    padded_plan = plan_engine_build(
        plan.onnx_path,
        tmp_path / "model.engine",
        input_name="pixel_values",
        chw=CHW,
        min_batch=2,
        opt_batch=2,
        max_batch=4,
        workspace_mb=512,
        optimization_level=1,
        precision="fp16",
    )
    build_engine(padded_plan)
    batch = np.random.default_rng(3).standard_normal((1, *CHW)).astype(np.float32)
    with TrtBackend(
        padded_plan.engine_path, padded_plan.meta_path, CHW, None, BackendOptions(device="cuda")
    ) as backend:
        got = backend.run(batch)
    assert got.shape == (1, 10)
    assert float(np.abs(got - eager(model, batch)).max()) <= TOLERANCE


@pytest.fixture(scope="module")
def built_int8(built, request, tmp_path_factory):
    """model.int8.trt.onnx of the demo model (S8 symmetric Q/DQ, calibrated on the demo images), built
    into an INT8 engine: explicit quantization, strongly typed, no INT8 builder flag."""
    from vitdeploy.demo import IMAGES_DIR
    from vitdeploy.export.quantize import TENSORRT, quantize_int8
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.preprocess import Preprocessor

    model = built[0]
    artifacts_dir = request.getfixturevalue("demo_artifacts")
    artifacts = Artifacts.open(artifacts_dir)
    images = Preprocessor(artifacts.preprocess).batch(
        sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))
    )
    folder = tmp_path_factory.mktemp("trt_int8")
    qdq = folder / "model.int8.trt.onnx"
    quantize_int8(artifacts_dir / "model.onnx", qdq, input_name="pixel_values", calibration=images, placement=TENSORRT)
    plan = plan_engine_build(
        qdq,
        folder / "model.int8.engine",
        input_name="pixel_values",
        chw=CHW,
        min_batch=1,
        opt_batch=8,
        max_batch=64,
        workspace_mb=512,
        optimization_level=1,
        precision="int8",
    )
    meta = build_engine(plan)
    return model, plan, meta, images


def test_int8_engine_from_the_qdq_graph_within_validation_int8(built_int8):
    from vitdeploy.export.compare import logit_metrics

    model, plan, meta, images = built_int8
    assert meta.precision.startswith("int8")
    with TrtBackend(
        plan.engine_path, plan.meta_path, CHW, None, BackendOptions(device="cuda"), name="trt-int8"
    ) as backend:
        got = backend.run(images)
        alone = np.concatenate([backend.run(images[i : i + 1]) for i in range(4)])
    metrics, flipped = logit_metrics(eager(model, images), got)
    assert metrics["max_abs_diff"] <= 1.0 and metrics["cosine"] >= 0.99 and metrics["top1_agreement"] >= 0.98, metrics
    # static scales: no dependence on the other images beyond a rounding step where another kernel is picked
    assert float(np.abs(alone - got[:4]).max()) <= 0.05
