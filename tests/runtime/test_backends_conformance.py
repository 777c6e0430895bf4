"""Every backend of the vocabulary behind one interface: parametrised from ``vocab.RUNTIME_BACKENDS``,
never from names typed here, so a backend added to the vocabulary is checked without editing this file.

On the demo export (every CPU artifact), each backend that can run here must: take a float32 NCHW
batch and give float32 (N, classes) logits, the same for a row alone as in a batch, refuse a batch of
the wrong shape or dtype with InputError, describe itself in one line, and refuse to run once closed.
One that cannot run here (no TensorRT, no CUDA) says why in one line; that is the skip's reason.
"""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.base.errors import BackendError, InputError
from vitdeploy.base.vocab import BACKEND_KINDS, RUNTIME_BACKENDS
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.backends import BackendOptions, backend_unavailable_reason, open_backend

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def artifacts(demo_artifacts):
    return Artifacts.open(demo_artifacts)


@pytest.mark.parametrize("name", RUNTIME_BACKENDS)
def test_every_backend_keeps_the_contract(artifacts, name):
    options = BackendOptions(threads=1)
    why = backend_unavailable_reason(name, artifacts, options)
    if why is not None:
        assert "\n" not in why and why.strip()
        pytest.skip(f"{name} cannot run here: {why}")
    classes = len(artifacts.labels)
    batch = np.random.default_rng(0).standard_normal((3, *artifacts.input_shape)).astype(np.float32)
    backend = open_backend(name, artifacts, options)
    try:
        assert backend.name == name and "\n" not in backend.describe()
        logits = backend.run(batch)
        assert logits.dtype == np.float32 and logits.shape == (3, classes)
        alone = backend.run(batch[1:2])
        tolerance = 1e-4 if BACKEND_KINDS[name].precision == "fp32" else 0.05
        assert np.abs(alone[0] - logits[1]).max() <= tolerance  # a row's answer does not depend on its batch
        with pytest.raises(InputError):
            backend.run(batch.astype(np.float64))
        with pytest.raises(InputError):
            backend.run(batch[:, :, :-1])
    finally:
        backend.close()
    with pytest.raises(BackendError):
        backend.run(batch)
