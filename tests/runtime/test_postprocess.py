"""The export's score function (runtime/postprocess.py): softmax over the classes, or SigLIP's sigmoid of each
logit on its own, computed without overflow, and their logs (what `validate --url` compares /predict's scores as)."""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.base.errors import InputError
from vitdeploy.runtime.postprocess import log_probabilities, probabilities, sigmoid, softmax

LOGITS = np.array([[2.0, -1.0, 0.5, -30.0], [800.0, -800.0, 0.0, 1e-3]])


def test_softmax_is_the_default_and_sums_to_one():
    probs = probabilities(LOGITS)
    np.testing.assert_array_equal(probs, softmax(LOGITS, axis=-1))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)


def test_sigmoid_scores_each_class_on_its_own():
    """SigLIP's probabilities: 1 / (1 + exp(-x)) per logit, no overflow at +-800, not summing to one."""
    probs = probabilities(LOGITS, "sigmoid")
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs[0], 1 / (1 + np.exp(-LOGITS[0])), rtol=1e-12)
    assert probs[1, 0] == 1.0 and probs[1, 1] == 0.0 and probs[1, 2] == 0.5
    assert not np.allclose(probs.sum(axis=1), 1.0)
    # one class's score does not depend on the others (it does under softmax)
    moved = LOGITS.copy()
    moved[0, 1] += 5
    assert probabilities(moved, "sigmoid")[0, 0] == probs[0, 0]
    assert probabilities(moved)[0, 0] != probabilities(LOGITS)[0, 0]
    np.testing.assert_array_equal(sigmoid(np.array([np.nan])), [np.nan])


@pytest.mark.parametrize("scores", ["softmax", "sigmoid"])
def test_log_probabilities_are_the_log_of_the_scores_without_underflow(scores):
    logs = log_probabilities(LOGITS, scores)
    assert np.isfinite(logs).all()  # log(0) avoided: -800 gives about -1600 (softmax) or -800 (sigmoid)
    finite = np.exp(logs) > 1e-300
    np.testing.assert_allclose(np.exp(logs)[finite], probabilities(LOGITS, scores)[finite], rtol=1e-9)


def test_an_unknown_score_function_is_refused():
    with pytest.raises(InputError, match="unknown score function 'tanh'"):
        probabilities(LOGITS, "tanh")
    with pytest.raises(InputError, match="unknown score function"):
        log_probabilities(LOGITS, "tanh")
