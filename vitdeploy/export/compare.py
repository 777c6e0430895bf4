"""Pure comparison of a candidate's outputs against the eager-PyTorch reference.

Tolerances are data (pipeline.yaml ``validation.fp32`` / ``validation.fp16``); ``compare``
collects every metric that misses its threshold instead of stopping at the first.

What is measured depends on the output's kind (vocab.OUTPUT_KINDS). Logits: differences, the lowest
cosine, top-1 agreement and top-5 overlap (and the inputs whose top-1 flipped). Embeddings: differences,
cosine per input (lowest, 1st percentile, median) and neighbour agreement: each input's k nearest
neighbours (cosine, among the inputs compared) under eager PyTorch against its k nearest under the
candidate, the mean overlap (recall@k); a vector has no classes, so no top-k and no flips. An embedding
export's patch tokens (``patches``: the reference's and the candidate's (N, P, D)) are judged beside the
vector by the cosine of each token to eager's: the lowest over every token of every input (``patch_cosine``,
gated by ``min_patch_cosine``) and its 1st percentile (``patch_cosine_p01``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..base.errors import first_line
from ..base.output_spec import EMBEDDING

# metric name -> (threshold key, "max" if the metric must stay <= threshold else "min")
_RULES = {
    "max_abs_diff": ("max_abs_diff", "max"),
    "mean_abs_diff": ("mean_abs_diff", "max"),
    "cosine": ("min_cosine", "min"),
    "top1_agreement": ("min_top1_agreement", "min"),
    "top5_overlap": ("min_top5_overlap", "min"),
    "recall_at_k": ("min_recall_at_k", "min"),
    "patch_cosine": ("min_patch_cosine", "min"),
}

DEFAULT_NEIGHBOURS = 10
#: the failures a user reads first when several metrics fail: whether the answers agree (top-1; for embeddings the
#: cosine, the neighbours) says more than how far the numbers moved
TELLING = ("top1_agreement", "cosine", "recall_at_k")


@dataclass(frozen=True)
class Comparison:
    metrics: dict[str, float]
    thresholds: dict[str, float]
    failures: tuple[str, ...]
    flipped: tuple[int, ...] = field(default=())  # rows whose top-1 changed (embeddings: whose neighbours changed)
    kind: str = "logits"  # what was compared (vocab.OUTPUT_KINDS)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def headline(self) -> str:
        """The failure that says most to a user, in one line: a :data:`TELLING` metric's first, else the first
        (empty when it passed)."""
        telling = (f for metric in TELLING for f in self.failures if f.startswith(metric + ":"))
        return first_line(next(telling, self.failures[0] if self.failures else ""))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        rows = d.pop("flipped")
        d["failures"] = list(self.failures)
        d["neighbours_changed" if self.kind == EMBEDDING else "flipped"] = list(rows)
        if self.kind != EMBEDDING:
            d.pop("kind")
        return d


def _cosines(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    return np.where(norms > 0, np.sum(ref * cand, axis=1) / np.maximum(norms, 1e-300), 1.0)


#: two neighbours whose cosines to an input (under eager PyTorch) differ by less than this are a tie: which of
#: them ranks k-th is float rounding (two near-duplicate images), not a swap the artifact made
NEIGHBOUR_TIE = 1e-6


#: rows of the (rows x N) cosine matrix held at once: a validation set of 50,000 images is 0.4 GB a block, not 20 GB
_BLOCK = 1024


def _unit(vectors: np.ndarray) -> np.ndarray:
    x = np.asarray(vectors, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)


def _similarities(unit: np.ndarray, rows: slice) -> np.ndarray:
    """Cosines of ``rows`` to every row (a row's own: -inf, it is not its own neighbour)."""
    sim = unit[rows] @ unit.T
    sim[np.arange(sim.shape[0]), np.arange(rows.start, rows.start + sim.shape[0])] = -np.inf
    return sim


def nearest_neighbours(vectors: np.ndarray, k: int) -> np.ndarray:
    """(N, k) indices of each row's k most cosine-similar other rows, most similar first (ties: lower index)."""
    unit = _unit(vectors)
    out = [
        np.argsort(-_similarities(unit, slice(i, i + _BLOCK)), axis=1, kind="stable")[:, :k]
        for i in range(0, len(unit), _BLOCK)
    ]
    return np.concatenate(out) if out else np.zeros((0, k), dtype=int)


def neighbour_recall(reference: np.ndarray, candidate: np.ndarray, k: int = DEFAULT_NEIGHBOURS) -> np.ndarray:
    """Per input: the share of its k nearest neighbours under ``candidate`` that are among its k nearest under
    ``reference`` (recall@k; k clipped to the other inputs; 1.0 each when there is no other input). A neighbour
    tied under the reference with its k-th nearest (within :data:`NEIGHBOUR_TIE`) counts as one of them."""
    n = len(reference)
    k = min(int(k), n - 1)
    if k < 1:
        return np.ones(n)
    if not np.all(np.isfinite(candidate)):
        return np.zeros(n)
    ref, cand = _unit(reference), _unit(candidate)
    out = []
    for i in range(0, n, _BLOCK):
        rows = slice(i, min(i + _BLOCK, n))
        ref_sim, cand_sim = _similarities(ref, rows), _similarities(cand, rows)
        kth = -np.partition(-ref_sim, k - 1, axis=1)[:, k - 1 : k]  # each input's k-th largest cosine, eager
        cand_nn = np.argsort(-cand_sim, axis=1, kind="stable")[:, :k]
        out.append((np.take_along_axis(ref_sim, cand_nn, axis=1) >= kth - NEIGHBOUR_TIE).sum(axis=1) / k)
    return np.concatenate(out)


def embedding_metrics(
    reference: np.ndarray, candidate: np.ndarray, k: int = DEFAULT_NEIGHBOURS
) -> tuple[dict[str, float], tuple[int, ...]]:
    """Differences, cosine (lowest, 1st percentile, median) and recall@k of two (N, D) sets of vectors; the
    rows returned are those whose neighbours changed."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"reference shape {ref.shape} != candidate shape {cand.shape}")
    finite = bool(np.all(np.isfinite(cand)))
    diff = np.abs(ref - cand) if finite else np.full(ref.shape, np.inf)
    cosine = _cosines(ref, cand) if finite else -np.ones(len(ref))
    recall = neighbour_recall(ref, cand, k)
    metrics = {
        "max_abs_diff": float(diff.max()) if diff.size else 0.0,
        "mean_abs_diff": float(diff.mean()) if diff.size else 0.0,
        "cosine": float(cosine.min()) if cosine.size else 1.0,
        "cosine_p01": float(np.percentile(cosine, 1)) if cosine.size else 1.0,
        "cosine_p50": float(np.median(cosine)) if cosine.size else 1.0,
        "recall_at_k": float(recall.mean()) if recall.size else 1.0,
    }
    return metrics, tuple(int(i) for i in np.flatnonzero(recall < 1.0))


#: inputs whose patch tokens are compared at once (float64 copies of 256 x P x D, not of every input's)
_TOKEN_BLOCK = 256

#: a pair (reference, candidate) of patch tokens, each (N, P, D); None where the export has none
Patches = Optional[tuple[np.ndarray, np.ndarray]]


def token_cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """(N, P) cosine of each patch token of each input to eager's (-1 for every token of a candidate that is not
    finite); ValueError when the shapes differ."""
    if np.shape(reference) != np.shape(candidate) or np.ndim(reference) != 3:
        raise ValueError(f"reference patch tokens {np.shape(reference)} != candidate's {np.shape(candidate)}")
    out = []
    for i in range(0, len(reference), _TOKEN_BLOCK):
        ref = np.asarray(reference[i : i + _TOKEN_BLOCK], dtype=np.float64)
        cand = np.asarray(candidate[i : i + _TOKEN_BLOCK], dtype=np.float64)
        if not np.all(np.isfinite(cand)):
            out.append(-np.ones(ref.shape[:2]))
            continue
        norms = np.linalg.norm(ref, axis=2) * np.linalg.norm(cand, axis=2)
        out.append(np.where(norms > 0, np.sum(ref * cand, axis=2) / np.maximum(norms, 1e-300), 1.0))
    return np.concatenate(out) if out else np.ones((0, np.shape(reference)[1]))


def patch_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """The patch tokens' lowest cosine to eager's over every token of every input, its 1st percentile, and the
    largest |difference|."""
    cosine = token_cosines(reference, candidate)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = max((float(np.abs(r - c).max()) for r, c in zip(reference, candidate) if r.size), default=0.0)
    return {
        "patch_cosine": float(cosine.min()) if cosine.size else 1.0,
        "patch_cosine_p01": float(np.percentile(cosine, 1)) if cosine.size else 1.0,
        "patch_max_abs_diff": diff if np.isfinite(diff) else float("inf"),
    }


def output_metrics(
    reference: np.ndarray,
    candidate: np.ndarray,
    kind: str = "logits",
    tolerance: Mapping[str, float] | None = None,
    patches: Patches = None,
) -> tuple[dict[str, float], tuple[int, ...]]:
    """The metrics of ``kind`` (vocab.OUTPUT_KINDS) and the rows that changed (top-1 flips, or changed
    neighbours); with ``patches``, the patch tokens' metrics too."""
    if kind == EMBEDDING:
        k = int((tolerance or {}).get("neighbours", DEFAULT_NEIGHBOURS))
        metrics, rows = embedding_metrics(reference, candidate, k)
    else:
        metrics, rows = logit_metrics(reference, candidate)
    if patches is not None:
        metrics.update(patch_metrics(*patches))
    return metrics, rows


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
    cosine = _cosines(ref, cand)
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


def compare(
    reference: np.ndarray,
    candidate: np.ndarray,
    tolerance: Mapping[str, float],
    kind: str = "logits",
    patches: Patches = None,
) -> Comparison:
    """Judge ``candidate`` against ``reference`` (N, K) with ``tolerance`` (a Tolerance dump); ``kind``: what
    the rows are (vocab.OUTPUT_KINDS); ``patches``: an embedding's patch tokens, the reference's and the
    candidate's. ``flipped``: the rows whose top-1, or whose neighbours, changed."""
    metrics, flipped = output_metrics(reference, candidate, kind, tolerance, patches)
    thresholds = {k: float(v) for k, v in tolerance.items()}
    return Comparison(metrics, thresholds, _failures(metrics, tolerance), flipped, kind)


def proven_failure(
    reference: np.ndarray,
    candidate: np.ndarray,
    total: int,
    tolerance: Mapping[str, float],
    kind: str = "logits",
    patches: Patches = None,
) -> Comparison | None:
    """What some rows (``reference``/``candidate``: n of the ``total`` a judgement covers) already prove:
    each metric bounded with every row not run at its best (no difference, cosine 1, top-1 and top-5
    kept): the largest difference and the lowest cosine are at least as bad as these rows', the means
    at least as bad as these rows' share of them. A Comparison failing on every bound that misses its
    threshold (its metrics are those bounds, ``inputs_judged`` says on how many rows), or None when the
    rows prove nothing: then only every row can judge. Neighbours depend on every row: for embeddings only the
    differences and the cosine are bounded (and the patch tokens' lowest cosine, with ``patches``)."""
    metrics, flipped = output_metrics(reference, candidate, kind, tolerance, patches)
    n, rest = len(reference), total - len(reference)
    bounds = {
        "max_abs_diff": metrics["max_abs_diff"],
        "mean_abs_diff": metrics["mean_abs_diff"] * n / total,
        "cosine": metrics["cosine"],
    }
    if patches is not None:
        bounds["patch_cosine"] = metrics["patch_cosine"]
    if kind != EMBEDDING:
        bounds["top1_agreement"] = (metrics["top1_agreement"] * n + rest) / total
        bounds["top5_overlap"] = (metrics["top5_overlap"] * n + rest) / total
    else:
        flipped = ()
    failures = _failures(bounds, tolerance, f" ({n} of {total} inputs run: the others cannot make up for it)")
    if not failures:
        return None
    thresholds = {k: float(v) for k, v in tolerance.items()}
    return Comparison({**bounds, "inputs_judged": float(n)}, thresholds, failures, flipped, kind)


def _failures(metrics: Mapping[str, float], tolerance: Mapping[str, float], qualifier: str = "") -> tuple[str, ...]:
    """Every metric that misses its threshold, as a line (``qualifier``: said of a bound)."""
    failures = []
    for metric, (key, kind) in _RULES.items():
        if key not in tolerance or metric not in metrics:  # a metric of another output kind
            continue
        value, limit = metrics[metric], float(tolerance[key])
        ok = value <= limit if kind == "max" else value >= limit
        if not ok:
            op = "<=" if kind == "max" else ">="
            bound = ("at least " if kind == "max" else "at most ") if qualifier else ""
            failures.append(f"{metric}: expected {op} {limit:g}, got {bound}{value:.6g}{qualifier}")
    return tuple(failures)


def failing_rows(
    reference: np.ndarray,
    candidate: np.ndarray,
    tolerance: Mapping[str, float],
    most: int = 8,
    kind: str = "logits",
    patches: Patches = None,
) -> list[int]:
    """The rows that fail on their own (top-1 changed, or for embeddings neighbours changed; or their largest
    difference, cosine or lowest patch-token cosine past its threshold), worst first, at most ``most``: the
    witnesses a next, similar candidate is tried on first."""
    ref, cand = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    per = per_image(ref, cand)
    diff = np.array([np.inf if v is None else v for v in per["max_abs_diff"]])
    cosine = np.array([-1.0 if v is None else v for v in per["cosine"]])
    if kind == EMBEDDING:
        bad = neighbour_recall(ref, cand, int(tolerance.get("neighbours", DEFAULT_NEIGHBOURS))) < 1.0
    else:
        bad = ref.argmax(axis=1) != cand.argmax(axis=1)
    if "max_abs_diff" in tolerance:
        bad |= diff > float(tolerance["max_abs_diff"])
    if "min_cosine" in tolerance:
        bad |= cosine < float(tolerance["min_cosine"])
    if patches is not None and "min_patch_cosine" in tolerance:
        bad |= token_cosines(*patches).min(axis=1, initial=1.0) < float(tolerance["min_patch_cosine"])
    rows = [int(i) for i in np.flatnonzero(bad)]
    return sorted(rows, key=lambda i: -diff[i])[:most]


def per_image(
    reference: np.ndarray,
    candidate: np.ndarray,
    kind: str = "logits",
    neighbours: int = DEFAULT_NEIGHBOURS,
    patches: Patches = None,
) -> dict[str, list[float]]:
    """Each input's max |diff| and cosine against the reference (and, for embeddings, its neighbour recall; with
    ``patches``, its patch tokens' lowest cosine): what a report plots as a distribution (the metrics above keep
    only the worst)."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(ref - cand).max(axis=1) if ref.size else np.zeros(0)
        cosine = _cosines(ref, cand)
    clean = lambda a: [round(float(v), 7) if np.isfinite(v) else None for v in a]  # noqa: E731
    out = {"max_abs_diff": clean(diff), "cosine": clean(cosine)}
    if kind == EMBEDDING:
        out["recall_at_k"] = clean(neighbour_recall(ref, cand, neighbours))
    if patches is not None:
        out["patch_cosine"] = clean(token_cosines(*patches).min(axis=1, initial=1.0))
    return out


def top_classes(
    logits: np.ndarray, labels: Sequence[str], k: int = 3, scores: str = "softmax"
) -> list[list[tuple[str, float]]]:
    """Each row's k best classes with their probabilities (the export's score function: softmax or sigmoid),
    best first."""
    from ..runtime.postprocess import probabilities

    probs = probabilities(np.asarray(logits, dtype=np.float64), scores)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    name = lambda i: labels[i] if 0 <= i < len(labels) else str(i)  # noqa: E731
    return [[(name(int(i)), round(float(probs[r, i]), 6)) for i in row] for r, row in enumerate(order)]


def flip_details(
    reference: np.ndarray,
    candidate: np.ndarray,
    names: Sequence[str],
    labels: Sequence[str],
    k: int = 3,
    scores: str = "softmax",
) -> list[dict[str, Any]]:
    """The inputs whose top-1 changed: their name, and the reference's and the candidate's top-k side by side
    (probabilities by ``scores``, the export's score function)."""
    _, flipped = logit_metrics(reference, candidate)
    if not flipped:
        return []
    rows = list(flipped)
    ref_top = top_classes(np.asarray(reference)[rows], labels, k, scores)
    cand_top = top_classes(np.asarray(candidate)[rows], labels, k, scores)
    return [{"input": str(names[i]), "reference": ref_top[n], "candidate": cand_top[n]} for n, i in enumerate(rows)]
