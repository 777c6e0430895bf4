"""Logits to scores: a numerically stable softmax or sigmoid (the export's score function, ``output.scores``),
and top-k. numpy only."""

from __future__ import annotations

import numpy as np

from ..base.errors import InputError


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, computed in float64 after subtracting the max (no overflow).

    Returns float64. Rows containing NaN give NaN; rows with +inf logits share the mass among
    them; -inf logits get 0.
    """
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 0:
        raise InputError("softmax needs at least a 1-D array of logits, got a scalar")
    peak = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = np.exp(x - np.where(np.isfinite(peak), peak, 0.0))
        shifted = np.where(np.isposinf(peak), (x == np.inf).astype(np.float64), shifted)
        return shifted / np.sum(shifted, axis=axis, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Each logit's logistic sigmoid on its own, in float64 without overflow (SigLIP's scores); NaN stays NaN."""
    x = np.asarray(logits, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(-np.abs(x))  # never overflows: exp of a non-positive number
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def probabilities(logits: np.ndarray, scores: str = "softmax") -> np.ndarray:
    """float64 scores of (N, C) logits by the export's score function (``ModelOutput.scores``): ``softmax``
    over each row, or ``sigmoid`` of each logit (SigLIP's zero-shot classes, independent of one another)."""
    if scores == "sigmoid":
        return sigmoid(logits)
    if scores == "softmax":
        return softmax(logits, axis=-1)
    raise InputError(f"unknown score function {scores!r}; expected softmax or sigmoid")


def log_probabilities(logits: np.ndarray, scores: str = "softmax") -> np.ndarray:
    """The log of :func:`probabilities`, computed without underflow (log-softmax, log-sigmoid), float64."""
    x = np.asarray(logits, dtype=np.float64)
    if scores == "sigmoid":
        return -np.logaddexp(0.0, -x)
    if scores != "softmax":
        raise InputError(f"unknown score function {scores!r}; expected softmax or sigmoid")
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def top_k(scores: np.ndarray, k: int = 5) -> list[tuple[int, float]]:
    """The ``k`` best (index, score) pairs of a 1-D score vector, best first.

    Ties keep the lower index first (stable order); ``k`` larger than the number of classes
    returns every class.
    """
    row = np.asarray(scores)
    if row.ndim != 1:
        raise InputError(f"top_k expects one 1-D row of scores, got shape {row.shape}")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise InputError(f"top_k needs k >= 1, got {k!r}")
    k = min(int(k), row.shape[0])
    # NaN sorts last: rank on -score with NaN mapped to +inf.
    key = np.where(np.isnan(row), np.inf, -row.astype(np.float64))
    order = np.argsort(key, kind="stable")[:k]
    return [(int(i), float(row[i])) for i in order]
