"""`vitdeploy bench` on a CUDA GPU, for real: torch FP32 and FP16 on cuda are timed with CUDA events beside the
eager CPU baseline, and the report names the GPU. Skips, with the reason ``cuda_status`` gives, without one."""

from __future__ import annotations

import math

import pytest

from vitdeploy.base.vocab import TORCH, TORCH_FP16
from vitdeploy.evaluate.bench import run_bench
from vitdeploy.evaluate.bench_report import BASELINE
from vitdeploy.runtime.cuda import cuda_status

CUDA_OK, CUDA_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.skipif(not CUDA_OK, reason=CUDA_WHY)]


def test_torch_fp16_on_cuda_is_timed_with_cuda_events_beside_the_cpu_baseline(demo_artifacts):
    report = run_bench(demo_artifacts, backends=[TORCH, TORCH_FP16], batch_sizes=[1, 8], iterations=5, warmup=2)
    rows = {row["name"]: row for row in report.backends}
    assert rows[TORCH_FP16]["status"] == "ran", rows[TORCH_FP16]
    assert "cuda" in rows[TORCH_FP16]["describe"] and "fp16" in rows[TORCH_FP16]["describe"]
    assert any("cuda:0" in gpu for gpu in report.environment["gpus"])
    for size in (1, 8):
        gpu = report.result(TORCH_FP16, size)
        assert gpu.timer == "cuda-events"
        assert gpu.stats.samples == 5 and math.isfinite(gpu.stats.p50_ms) and gpu.stats.p50_ms > 0
        assert report.result(BASELINE, size).timer == "perf_counter"
        assert gpu.speedup is not None and gpu.speedup > 0
