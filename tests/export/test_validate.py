"""The export's validation costs what it must: every input at the largest batch, a sample at the smaller
sizes, and a graph wrong only at batch 1 or only at an odd batch is still caught (export/validate.py).

The backends here are small numpy functions standing in for a graph (what is tested is the judging
logic, not a runtime); the whole export's validation runs in test_pipeline.py."""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.export.validate import SAMPLE, ValidationInputs, sample_rows, validate_artifact

FP32 = {"max_abs_diff": 1e-3, "mean_abs_diff": 1e-4, "min_cosine": 0.9999, "min_top1_agreement": 1.0}
N, CLASSES = 48, 10


class Graph:
    """logits = flattened image @ W, run in the batches it is given; ``wrong(batch)`` says how to
    corrupt a batch (None: never). Counts the rows it computed."""

    def __init__(self, wrong=None) -> None:
        self.w = np.random.default_rng(1).standard_normal((3 * 4 * 4, CLASSES)).astype(np.float32)
        self.wrong = wrong
        self.rows = 0
        self.name = "graph"

    def exact(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(len(x), -1) @ self.w

    def run(self, x: np.ndarray) -> np.ndarray:
        self.rows += len(x)
        out = self.exact(x)
        return self.wrong(out) if self.wrong is not None else out


@pytest.fixture
def inputs() -> ValidationInputs:
    batch = np.random.default_rng(0).standard_normal((N, 3, 4, 4)).astype(np.float32)
    return ValidationInputs(batch, tuple(f"noise:{i}" for i in range(N)))


def _validate(graph: Graph, inputs: ValidationInputs):
    return validate_artifact("validate-x", graph, inputs, graph.exact(inputs.batch), FP32, (1, 3, 16))


def test_a_right_graph_passes_at_every_size_running_every_input_once_and_a_sample_at_the_rest(inputs):
    graph = Graph()
    result = _validate(graph, inputs)
    assert result.passed and list(result.per_batch) == [1, 3, 16]
    assert result.rows == {1: SAMPLE, 3: SAMPLE, 16: N}
    assert graph.rows == N + 2 * SAMPLE  # was 3 x N: every input at every size
    report = result.to_dict()
    assert report["rows_per_batch"] == {"1": SAMPLE, "3": SAMPLE, "16": N} and report["passed"]


def test_logits_the_autopilot_already_computed_at_the_largest_batch_are_not_computed_again(inputs):
    graph = Graph()
    known = graph.exact(inputs.batch)
    result = validate_artifact("validate-x", graph, inputs, known, FP32, (1, 3, 16), largest_logits=known)
    assert result.passed and graph.rows == 2 * SAMPLE and result.rows == {1: SAMPLE, 3: SAMPLE, 16: N}
    wrong = validate_artifact("validate-x", graph, inputs, known, FP32, (1, 3, 16), largest_logits=known + 1)
    assert not wrong.per_batch[16].passed  # judged all the same


def test_a_long_validation_says_how_far_it_is_after_every_batch(inputs):
    said: list[str] = []
    graph = Graph()
    validate_artifact("validate-x", graph, inputs, graph.exact(inputs.batch), FP32, (1, 3, 16), progress=said.append)
    total = N + 2 * SAMPLE
    assert said[0] == f"16 of {total} inputs run" and said[-1] == f"{total} of {total} inputs run"
    done = [int(line.split()[0]) for line in said]
    assert done == sorted(done) and len(said) == N // 16 + SAMPLE + -(-SAMPLE // 3)  # one line per batch run


def test_a_graph_wrong_only_at_batch_1_is_caught(inputs):
    shifted = Graph(wrong=lambda out: out + 0.5 if len(out) == 1 else out)
    result = _validate(shifted, inputs)
    assert not result.passed
    assert not result.per_batch[1].passed and result.per_batch[3].passed and result.per_batch[16].passed
    assert any("batch 1: batch invariance" in f for f in result.failures), result.failures
    assert any(f.startswith("batch 1: max_abs_diff") for f in result.failures), result.failures


def test_a_graph_wrong_only_at_an_odd_batch_is_caught(inputs):
    # rows of a batch of 3 leak into each other (a broadcast over the batch axis), nowhere else
    leaky = Graph(wrong=lambda out: out + out.mean(axis=0, keepdims=True) if len(out) == 3 else out)
    result = _validate(leaky, inputs)
    assert not result.per_batch[3].passed and result.per_batch[1].passed and result.per_batch[16].passed
    assert any(f.startswith("batch 3: ") for f in result.failures)


def test_a_graph_wrong_only_at_the_largest_batch_fails_on_every_input(inputs):
    off = Graph(wrong=lambda out: out * 1.01 if len(out) == 16 else out)
    result = _validate(off, inputs)
    assert not result.per_batch[16].passed


@pytest.mark.parametrize("count, size", [(48, 1), (48, 3), (48, 16), (5, 3), (8, 1)])
def test_the_sample_spans_the_set_with_two_batches_and_a_tail(count, size):
    idx = sample_rows(count, size)
    want = min(count, max(SAMPLE, 2 * size + 1))
    assert len(idx) == want and idx[0] == 0 and idx[-1] == count - 1 and list(idx) == sorted(set(idx))
