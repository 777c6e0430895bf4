"""The Predictor on a CUDA GPU, for real (no stand-in): eager torch in FP32 and FP16 on cuda answers the demo
images as eager torch on the CPU does, and a GPU that is not there is refused by name. Skips, with the reason
``cuda_status`` gives, on a machine without one (CI)."""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.base.errors import BackendError
from vitdeploy.evaluate.dataset import load_validation_set
from vitdeploy.evaluate.drift import default_thresholds
from vitdeploy.runtime.backends import BackendOptions
from vitdeploy.runtime.cuda import cuda_status
from vitdeploy.runtime.predictor import Predictor

CUDA_OK, CUDA_WHY = cuda_status()
pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.skipif(not CUDA_OK, reason=CUDA_WHY)]


def _logits(artifacts, options: BackendOptions | None = None) -> tuple[Predictor, np.ndarray]:
    predictor = Predictor.from_artifacts(artifacts, "torch", options)
    paths = list(load_validation_set().paths)  # the shipped demo images
    return predictor, predictor.predict_logits(predictor.preprocess(paths))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_torch_on_cuda_answers_the_demo_images_as_on_the_cpu(demo_artifacts, precision):
    _, reference = _logits(demo_artifacts)
    predictor, logits = _logits(demo_artifacts, BackendOptions(device="cuda", precision=precision))
    assert "cuda" in predictor.backend.describe() and precision in predictor.backend.describe()
    assert logits.dtype == np.float32 and logits.shape == reference.shape
    assert (logits.argmax(1) == reference.argmax(1)).all()
    limit = default_thresholds()[precision]["max_abs_diff"]
    assert float(np.abs(logits - reference).max()) <= limit


def test_a_batch_larger_than_the_first_is_answered_the_same(demo_artifacts):
    """The CUDA backend keeps no state between calls: the same images alone or in a larger batch answer alike."""
    predictor, logits = _logits(demo_artifacts, BackendOptions(device="cuda", precision="fp32"))
    paths = list(load_validation_set().paths)
    one = predictor.predict_logits(predictor.preprocess(paths[:1]))
    np.testing.assert_allclose(one[0], logits[0], atol=1e-4)


def test_a_gpu_that_is_not_there_is_refused_by_its_index(demo_artifacts):
    import torch

    missing = torch.cuda.device_count()
    with pytest.raises(BackendError, match=rf"cuda:{missing}.*does not exist \({missing} CUDA device"):
        Predictor.from_artifacts(demo_artifacts, "torch", BackendOptions(device=f"cuda:{missing}"))
