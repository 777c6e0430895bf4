"""export/compare.py: what a few inputs prove about a gate that covers all of them.

The autopilots' judge fails a step on the inputs that failed the step before when they alone prove
the gate missed (compare.proven_failure): that proof must be sound (whatever the other inputs give,
the whole judgement fails too) and must say when it proves nothing."""

from __future__ import annotations

import numpy as np

from vitdeploy.export.compare import compare, failing_rows, proven_failure

GATE = {
    "max_abs_diff": 1.0,
    "mean_abs_diff": 0.1,
    "min_cosine": 0.99,
    "min_top1_agreement": 0.98,
    "min_top5_overlap": 0.9,
}


def _pair(rng: np.random.Generator, n: int = 48, k: int = 10, noise: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    ref = rng.standard_normal((n, k))
    return ref, ref + noise * rng.standard_normal((n, k))


def _flip(ref: np.ndarray, cand: np.ndarray, row: int) -> None:
    """The candidate's top-1 of ``row`` moved to the reference's runner-up (a small change)."""
    first, second = np.argsort(-ref[row])[:2]
    cand[row] = ref[row]
    cand[row, second] = ref[row, first] + 1e-3


def test_one_flipped_input_of_48_proves_a_98_percent_top1_gate_missed():
    ref, cand = _pair(np.random.default_rng(0))
    _flip(ref, cand, 7)
    assert not compare(ref, cand, GATE).passed
    proof = proven_failure(ref[[7]], cand[[7]], total=48, tolerance=GATE)
    assert proof is not None and not proof.passed and proof.metrics["inputs_judged"] == 1
    assert proof.failures == (
        "top1_agreement: expected >= 0.98, got at most 0.979167 "
        "(1 of 48 inputs run: the others cannot make up for it)",
    )


def test_rows_that_prove_nothing_leave_the_judgement_to_every_input():
    ref, cand = _pair(np.random.default_rng(1))
    _flip(ref, cand, 3)
    loose = {**GATE, "min_top1_agreement": 0.95}  # 2 flips of 48 allowed: one flip proves nothing
    assert proven_failure(ref[[3]], cand[[3]], total=48, tolerance=loose) is None
    assert proven_failure(ref[:5], ref[:5].copy(), total=48, tolerance=GATE) is None  # rows that pass


def test_the_largest_difference_and_lowest_cosine_of_a_few_rows_bound_the_whole():
    ref, cand = _pair(np.random.default_rng(2))
    cand[11] += 3.0  # one row far off (its top-1 kept: the same shift everywhere)
    proof = proven_failure(ref[[11]], cand[[11]], total=48, tolerance=GATE)
    assert proof is not None
    assert any(f.startswith("max_abs_diff: expected <= 1, got at least 3.") for f in proof.failures)
    assert not any(f.startswith("mean_abs_diff") for f in proof.failures)  # one row's share of a mean: too little


def test_a_proof_is_never_wrong_about_the_whole():
    """Random candidates, some rows corrupted, random subsets: whenever the subset proves a failure,
    judging every row fails too, on every metric the proof names."""
    rng = np.random.default_rng(3)
    proofs = 0
    for _ in range(400):
        ref, cand = _pair(rng, n=int(rng.integers(8, 64)), noise=float(rng.choice([0.01, 0.2, 1.0])))
        for row in rng.choice(len(ref), size=int(rng.integers(0, 4)), replace=False):
            _flip(ref, cand, int(row))
        subset = sorted(rng.choice(len(ref), size=int(rng.integers(1, len(ref))), replace=False).tolist())
        proof = proven_failure(ref[subset], cand[subset], total=len(ref), tolerance=GATE)
        if proof is None:
            continue
        proofs += 1
        whole = compare(ref, cand, GATE)
        assert not whole.passed
        assert {f.split(":")[0] for f in proof.failures} <= {f.split(":")[0] for f in whole.failures}
    assert proofs > 50  # the property was exercised


def test_failing_rows_are_the_rows_that_fail_alone_worst_first():
    ref = np.random.default_rng(4).standard_normal((48, 10))
    ref[:, 0] += 10.0  # a clear top-1 everywhere
    cand = ref + 1e-4
    _flip(ref, cand, 5)
    cand[9] += 40.0  # top-1 kept, the largest difference by far
    assert failing_rows(ref, cand, GATE) == [9, 5]
    assert failing_rows(ref, ref.copy(), GATE) == []


# --------------------------------------------------------------------------- embeddings: neighbour agreement

EMBED_GATE = {"max_abs_diff": 1.0, "mean_abs_diff": 1.0, "min_cosine": 0.99, "min_recall_at_k": 1.0, "neighbours": 2}


def _fan(a: list[float]) -> np.ndarray:
    """Row 0 = e0; row j = a_j e0 + sqrt(1 - a_j^2) e_j: cosine(0, j) = a_j, cosine(j, k) = a_j a_k."""
    out = np.zeros((len(a) + 1, len(a) + 1))
    out[0, 0] = 1.0
    for j, aj in enumerate(a, start=1):
        out[j, 0], out[j, j] = aj, np.sqrt(1 - aj * aj)
    return out


def test_neighbour_agreement_sees_an_int8_swap_of_two_neighbours_that_cosine_forgives():
    """Row 0's two nearest neighbours are rows 1 and 2 (cosine 0.95, 0.9000), row 3 a hair behind (0.8999).
    A candidate that moves row 3 by 5e-4 rad (cosine to eager 0.9999999) swaps rows 2 and 3 in row 0's
    neighbours: cosine and differences pass, recall@2 does not, and the gate names recall_at_k."""
    from vitdeploy.export.compare import nearest_neighbours, neighbour_recall

    ref = _fan([0.95, 0.9, 0.8999, 0.5, 0.3])
    cand = _fan([0.95, 0.9, 0.9002, 0.5, 0.3])
    assert nearest_neighbours(ref, 2)[0].tolist() == [1, 2]
    assert nearest_neighbours(cand, 2)[0].tolist() == [1, 3]  # the swap
    per = neighbour_recall(ref, cand, 2)
    assert per[0] == 0.5 and per.mean() < 1.0
    verdict = compare(ref, cand, EMBED_GATE, kind="embedding")
    assert verdict.metrics["cosine"] > 0.99999 and verdict.metrics["recall_at_k"] == float(per.mean())
    assert [f.split(":")[0] for f in verdict.failures] == ["recall_at_k"]  # cosine and diffs were within
    assert 0 in verdict.flipped and verdict.to_dict()["neighbours_changed"] == list(verdict.flipped)
    assert "flipped" not in verdict.to_dict() and "top1_agreement" not in verdict.metrics


def test_identical_vectors_agree_and_k_is_clipped_to_the_other_inputs():
    from vitdeploy.export.compare import neighbour_recall

    ref = _fan([0.95, 0.8, 0.6, 0.4, 0.2])
    assert neighbour_recall(ref, ref.copy(), 10).tolist() == [1.0] * 6  # k=10 of 5 others: all 5
    verdict = compare(ref, ref * 1.0000001, {**EMBED_GATE, "neighbours": 10}, kind="embedding")
    assert verdict.passed and verdict.metrics["recall_at_k"] == 1.0
    assert {"cosine", "cosine_p01", "cosine_p50"} <= set(verdict.metrics)


def test_a_nan_vector_fails_every_vector_gate():
    ref = _fan([0.95, 0.8, 0.6, 0.4, 0.2])
    cand = ref.copy()
    cand[2, 0] = np.nan
    verdict = compare(ref, cand, EMBED_GATE, kind="embedding")
    assert {f.split(":")[0] for f in verdict.failures} >= {"max_abs_diff", "cosine", "recall_at_k"}


def test_failing_rows_of_vectors_are_those_whose_neighbours_changed():
    ref = _fan([0.95, 0.8, 0.6, 0.4, 0.2])
    cand = ref.copy()
    cand[[1, 2]] = cand[[2, 1]]  # two inputs' vectors swapped: their neighbours and their neighbours' change
    rows = failing_rows(ref, cand, EMBED_GATE, kind="embedding")
    assert 1 in rows and 2 in rows
    proof = proven_failure(ref[:2], cand[:2], 6, EMBED_GATE, kind="embedding")
    assert proof is not None and "recall_at_k" not in proof.metrics  # neighbours need every row: never bounded


def test_a_tie_under_eager_is_no_swap():
    """Two near-duplicate images, tied as row 0's nearest under eager (cosines 0.9 and 0.9 + 1e-9): a candidate
    that orders them the other way by float rounding keeps recall@1 at 1.0; a real swap (1e-4 apart) does not."""
    from vitdeploy.export.compare import neighbour_recall

    ref = _fan([0.9, 0.9 + 1e-9, 0.5])
    assert neighbour_recall(ref, _fan([0.9 + 2e-9, 0.9, 0.5]), 1)[0] == 1.0
    assert neighbour_recall(_fan([0.9, 0.8999, 0.5]), _fan([0.9, 0.9001, 0.5]), 1)[0] == 0.0
