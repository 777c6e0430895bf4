"""The rollout's gate (vitdeploy/client/rollout/gate.py) on made-up shadow records: what passes, what fails and
how early, under which options and thresholds. By default agreement with the live version is reported, not gated:
a retrained model passes; ``same_model`` and ``min_agreement`` refuse it."""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.base.export_sections import ValidationSection
from vitdeploy.client.rollout.gate import backend_thresholds, gate_thresholds, judge_shadow

FP32 = ValidationSection().fp32.model_dump()
INT8 = ValidationSection().int8.model_dump()


def _samples(live: np.ndarray, candidate: np.ndarray, live_ms: float = 4.0, cand_ms: float = 4.0) -> list[dict]:
    return [
        {
            "live": live[i : i + 1],
            "candidate": candidate[i : i + 1],
            "live_ns": live_ms * 1e6,
            "candidate_ns": cand_ms * 1e6,
            "backend": "ort",
            "live_backend": "ort",
        }
        for i in range(len(live))
    ]


def _logits(seed: int, n: int = 40, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, classes)).astype(np.float32)


def test_the_same_answers_pass_once_the_budget_is_spent():
    live = _logits(0)
    verdict = judge_shadow(_samples(live, live.copy()), FP32, "logits", budget=40)
    assert verdict.passed and verdict.decided
    assert verdict.figures["requests"] == 40 and verdict.figures["agreement"]["top1_agreement"] == 1.0
    assert verdict.figures["latency_ms"]["candidate"]["p50"] == pytest.approx(4.0)


def test_the_same_answers_are_not_decided_before_the_budget():
    live = _logits(0, n=5)
    verdict = judge_shadow(_samples(live, live.copy()), FP32, "logits", budget=40)
    assert not verdict.decided


def test_a_retrained_model_passes_by_default_with_its_agreement_reported():
    live, retrained = _logits(0), _logits(1)
    early = judge_shadow(_samples(live[:2], retrained[:2]), FP32, "logits", budget=40)
    assert not early.decided  # nothing to prove before the budget is spent: agreement does not gate
    verdict = judge_shadow(_samples(live, retrained), FP32, "logits", budget=40)
    assert verdict.passed and verdict.decided
    agreed = verdict.figures["agreement"]
    flips = int((live.argmax(1) != retrained.argmax(1)).sum())
    assert agreed["top1_agreement"] == pytest.approx(1 - flips / 40) and agreed["flips"] == flips > 0


def test_with_same_model_another_model_is_rolled_back_at_its_first_answers_naming_the_agreement():
    samples = _samples(_logits(0, n=2), _logits(1, n=2))
    verdict = judge_shadow(samples, FP32, "logits", budget=200, same_model=True)
    assert verdict.decided and not verdict.passed
    assert verdict.reason.startswith("top1_agreement") and "2 of 200 inputs run" in verdict.reason


def test_a_minimum_agreement_refuses_below_it_as_soon_as_proven_and_passes_above_it():
    live = _logits(0, n=100)
    near = live.copy()
    near[:10] = _logits(1, n=10)  # at most 10 of 100 flip
    verdict = judge_shadow(_samples(live, near), FP32, "logits", budget=100, min_agreement=0.85)
    assert verdict.passed, verdict.reason
    far = _logits(1, n=100)
    early = judge_shadow(_samples(live[:40], far[:40]), FP32, "logits", budget=100, min_agreement=0.85)
    assert early.decided and not early.passed and early.reason.startswith("top1_agreement: expected >= 0.85")


def test_with_same_model_an_int8_past_its_gate_fails_on_the_whole_budget_and_one_within_it_passes():
    live = _logits(0, n=100)
    flipped = live.copy()
    for i in range(5):  # 5% of the tops change: the int8 set allows 2%
        flipped[i, [0, 1]] = flipped[i, [1, 0]]
        flipped[i, live[i].argmax()] -= 10
    limits = gate_thresholds(INT8, FP32)
    verdict = judge_shadow(_samples(live, flipped), limits, "logits", budget=100, same_model=True)
    assert not verdict.passed and verdict.reason.startswith("top1_agreement")
    near = live + np.float32(0.01)
    assert judge_shadow(_samples(live, near), limits, "logits", budget=100, same_model=True).passed


def test_a_failed_or_refused_copy_fails_the_candidate():
    live = _logits(0, n=3)
    samples = _samples(live, live.copy()) + [{"error": "no answer to a shadowed request within 5 s"}]
    verdict = judge_shadow(samples, FP32, "logits", budget=200)
    assert verdict.decided and not verdict.passed and "within 5 s" in verdict.reason


def test_another_output_width_is_reported_and_refused_only_when_agreement_is_asked():
    samples = _samples(_logits(0, n=2), _logits(0, n=2, classes=7))
    verdict = judge_shadow(samples, FP32, "logits", budget=2)
    assert verdict.passed and "7 values a row, the live version 10" in verdict.figures["note"]
    verdict = judge_shadow(samples, FP32, "logits", budget=9, min_agreement=0.5)
    assert not verdict.passed and "7 values a row, the live version 10" in verdict.reason


def test_embeddings_agree_by_cosine():
    live = _logits(0, n=20, classes=16)
    turned = live[:, ::-1].copy()
    verdict = judge_shadow(_samples(live, turned), FP32, "embedding", budget=20)
    assert verdict.passed and verdict.figures["agreement"]["cosine"] < 0.9
    verdict = judge_shadow(_samples(live, turned), FP32, "embedding", budget=20, same_model=True)
    assert not verdict.passed and verdict.reason.startswith("cosine")
    verdict = judge_shadow(_samples(live, turned), FP32, "embedding", budget=20, min_agreement=0.99)
    assert not verdict.passed and verdict.reason.startswith("cosine: expected >= 0.99")


def test_latency_is_reported_and_gates_only_when_asked():
    live = _logits(0, n=10)
    slow = _samples(live, live.copy(), live_ms=2.0, cand_ms=9.0)
    assert judge_shadow(slow, FP32, "logits", budget=10).passed
    verdict = judge_shadow(slow, FP32, "logits", budget=10, max_slowdown=2.0)
    assert not verdict.passed and "4.50x" in verdict.reason


def test_thresholds_come_from_the_exports_validation_of_that_backend_else_the_config():
    manifest = {"validate-int8": {"backend": "ort-int8", "thresholds": {**INT8, "min_top1_agreement": 0.5}}}
    assert backend_thresholds(manifest, "ort-int8", ValidationSection())["min_top1_agreement"] == 0.5
    assert backend_thresholds(manifest, "ort-fp16", ValidationSection()) == ValidationSection().fp16.model_dump()
    loose = gate_thresholds(FP32, INT8)
    assert loose["max_abs_diff"] == INT8["max_abs_diff"] and loose["min_top1_agreement"] == INT8["min_top1_agreement"]
