"""One backend's outputs judged against eager PyTorch's: the row of the drift report (export/compare.py's
metrics against a tolerance, the images whose top-1 class flipped, accuracy where true labels are known).

Pure numpy: ``validate`` (drift.py) and ``validate --url`` (client/served_check.py) judge through it alike.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..base.output_spec import EMBEDDING
from .drift_report import BackendDrift


def judge_backend(
    name: str,
    logits: np.ndarray,
    reference: np.ndarray,
    tolerance: Mapping[str, float],
    *,
    names: Sequence[str],
    true_index: Sequence[int | None],
    classes: Sequence[str],
    precision: str = "fp32",
    threshold_set: str | None = None,
    kind: str = "logits",
    patches: tuple[np.ndarray, np.ndarray] | None = None,
    scores: str = "softmax",
) -> BackendDrift:
    """Compare ``logits`` with the ``reference`` (both (N, K)) and build the backend's row.

    ``names[i]`` is the path of row i (listed when its top-1 flips); ``true_index[i]`` its true
    class or None. ``kind``: what the rows are (vocab.OUTPUT_KINDS); embeddings are judged by cosine and
    neighbour agreement, with no flips and no accuracy; ``patches``: the reference's and the backend's patch
    tokens, judged by cosine per token. Pure numpy: the unit tests drive it with synthetic logits.
    """
    from ..export.compare import compare, flip_details, per_image

    cmp = compare(reference, logits, tolerance, kind, patches)
    judged = dict(
        name=name,
        status="passed" if cmp.passed else "failed",
        precision=precision,
        threshold_set=threshold_set or precision,
        metrics=dict(cmp.metrics),
        thresholds=dict(cmp.thresholds),
        failures=list(cmp.failures),
        per_image=per_image(reference, logits, kind, int(tolerance.get("neighbours", 10)), patches),
    )
    if kind == EMBEDDING:  # a vector has no class: no flips, no accuracy
        return BackendDrift(**judged)
    ref_top, cand_top = np.asarray(reference).argmax(axis=1), np.asarray(logits).argmax(axis=1)

    def label(i: int) -> str:
        return classes[i] if 0 <= i < len(classes) else str(i)

    tops = {d["input"]: d for d in flip_details(reference, logits, [str(n) for n in names], classes, scores=scores)}
    flipped = [
        {
            "path": str(names[i]),
            "reference": label(int(ref_top[i])),
            "candidate": label(int(cand_top[i])),
            "label": label(true_index[i]) if true_index[i] is not None else None,
            "reference_top3": tops[str(names[i])]["reference"],
            "candidate_top3": tops[str(names[i])]["candidate"],
        }
        for i in cmp.flipped
    ]
    return BackendDrift(**judged, flipped=flipped, accuracy=accuracy(logits, true_index))


def accuracy(logits: np.ndarray, true_index: Sequence[int | None]) -> float | None:
    """Top-1 accuracy over the rows whose true class is known; None when none is."""
    known = [(i, t) for i, t in enumerate(true_index) if t is not None]
    if not known:
        return None
    top = np.asarray(logits).argmax(axis=1)
    return float(np.mean([top[i] == t for i, t in known]))


__all__ = ["accuracy", "judge_backend"]
