"""Pure comparison of a candidate's logits against the eager-PyTorch reference.

Tolerances are data (pipeline.yaml ``validation.fp32`` / ``validation.fp16``); ``compare``
collects every metric that misses its threshold instead of stopping at the first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

# metric name -> (threshold key, "max" if the metric must stay <= threshold else "min")
_RULES = {
    "max_abs_diff": ("max_abs_diff", "max"),
    "mean_abs_diff": ("mean_abs_diff", "max"),
    "cosine": ("min_cosine", "min"),
    "top1_agreement": ("min_top1_agreement", "min"),
    "top5_overlap": ("min_top5_overlap", "min"),
}


@dataclass(frozen=True)
class Comparison:
    metrics: dict[str, float]
    thresholds: dict[str, float]
    failures: tuple[str, ...]
    flipped: tuple[int, ...] = field(default=())  # rows whose top-1 changed

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        d["failures"], d["flipped"] = list(self.failures), list(self.flipped)
        return d


def logit_metrics(reference: np.ndarray, candidate: np.ndarray) -> tuple[dict[str, float], tuple[int, ...]]:
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"reference shape {ref.shape} != candidate shape {cand.shape}")
    diff = np.abs(ref - cand)
    if not np.all(np.isfinite(cand)):
        return {
            "max_abs_diff": float("inf"),
            "mean_abs_diff": float("inf"),
            "cosine": -1.0,
            "top1_agreement": 0.0,
            "top5_overlap": 0.0,
        }, tuple(range(len(ref)))
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    cosine = np.where(norms > 0, np.sum(ref * cand, axis=1) / np.maximum(norms, 1e-300), 1.0)
    top1_ref, top1_cand = ref.argmax(axis=1), cand.argmax(axis=1)
    k = min(5, ref.shape[1])
    top_ref = np.argsort(-ref, axis=1, kind="stable")[:, :k]
    top_cand = np.argsort(-cand, axis=1, kind="stable")[:, :k]
    overlap = [len(set(a) & set(b)) / k for a, b in zip(top_ref, top_cand)]
    metrics = {
        "max_abs_diff": float(diff.max()) if diff.size else 0.0,
        "mean_abs_diff": float(diff.mean()) if diff.size else 0.0,
        "cosine": float(cosine.min()) if cosine.size else 1.0,
        "top1_agreement": float(np.mean(top1_ref == top1_cand)) if len(ref) else 1.0,
        "top5_overlap": float(np.mean(overlap)) if overlap else 1.0,
    }
    return metrics, tuple(int(i) for i in np.flatnonzero(top1_ref != top1_cand))


def compare(reference: np.ndarray, candidate: np.ndarray, tolerance: Mapping[str, float]) -> Comparison:
    """Judge ``candidate`` against ``reference`` (N, K) with ``tolerance`` (a Tolerance dump)."""
    metrics, flipped = logit_metrics(reference, candidate)
    failures = []
    for metric, (key, kind) in _RULES.items():
        if key not in tolerance:
            continue
        value, limit = metrics[metric], float(tolerance[key])
        ok = value <= limit if kind == "max" else value >= limit
        if not ok:
            op = "<=" if kind == "max" else ">="
            failures.append(f"{metric}: expected {op} {limit:g}, got {value:.6g}")
    return Comparison(metrics, {k: float(v) for k, v in tolerance.items()}, tuple(failures), flipped)
