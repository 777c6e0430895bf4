"""The output side of the serving contract (:mod:`vitdeploy.serve.protocol`, which re-exports every name here):
the tensors a served model answers with, the same on `vitdeploy serve` and the generated Triton repository.

A classifier answers ``LOGITS`` FP32 [N, C], ``TOPK_LABELS`` BYTES [N, K] and ``TOPK_SCORES`` FP32 [N, K] (top-k of
the export's score function, softmax or SigLIP's sigmoid, as ``vitdeploy predict``); an embedding model (the
manifest's ``output.kind: embedding``) answers its vectors, ``EMBEDDINGS`` FP32 [N, D]; one exported with its
patch tokens (``output.patch_tokens``) also serves ``PATCH_TOKENS`` FP32 [N, P, D], answered only to a request
that names it in ``outputs`` (they are P times the vectors' size: a request naming no output gets EMBEDDINGS
alone). numpy only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..base.output_spec import EMBEDDING
from ..base.vocab import OUTPUT_TENSORS, PATCH_TOKENS

#: A classifier's output tensors: logits FP32 [N, C], top-k labels BYTES [N, K], top-k scores FP32 [N, K].
LOGITS = "LOGITS"
TOPK_LABELS = "TOPK_LABELS"
TOPK_SCORES = "TOPK_SCORES"
OUTPUTS = (LOGITS, TOPK_LABELS, TOPK_SCORES)
#: An embedding model's one output: its vectors, FP32 [N, D] (the graph's own output name, base/vocab.py).
EMBEDDINGS = OUTPUT_TENSORS[EMBEDDING]
#: Each v2 datatype an output has -> its name in Triton's model configuration.
CONFIG_TYPES = {"FP32": "TYPE_FP32", "BYTES": "TYPE_STRING"}
DEFAULT_TOP_K = 5


def served_outputs(embedding: bool, patch_tokens: bool = False) -> tuple[str, ...]:
    """The names of the outputs a model answers: (EMBEDDINGS,) for an embedding model (EMBEDDINGS, PATCH_TOKENS
    with ``patch_tokens``), else :data:`OUTPUTS`."""
    if embedding:
        return (EMBEDDINGS, PATCH_TOKENS) if patch_tokens else (EMBEDDINGS,)
    return OUTPUTS


def default_outputs(served: Sequence[str]) -> tuple[str, ...]:
    """What a request that names no output gets: every served output but PATCH_TOKENS (asked for by name)."""
    return tuple(name for name in served if name != PATCH_TOKENS)


def output_tensors(
    width: int, k: int = DEFAULT_TOP_K, embedding: bool = False, patch_shape: Sequence[int] | None = None
) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, v2 datatype, dimensions of a row) of each output the model answers: a classifier's LOGITS FP32 [C],
    TOPK_LABELS BYTES [K], TOPK_SCORES FP32 [K] (``width`` = C, ``K = min(k, C)``); an embedding model's
    EMBEDDINGS FP32 [D] (``width`` = D), then PATCH_TOKENS FP32 [P, D] where it has them (``patch_shape``)."""
    if embedding:
        tokens = [(PATCH_TOKENS, "FP32", tuple(int(d) for d in patch_shape))] if patch_shape else []
        return [(EMBEDDINGS, "FP32", (int(width),)), *tokens]
    kk = max(1, min(int(k), int(width)))
    return [(LOGITS, "FP32", (int(width),)), (TOPK_LABELS, "BYTES", (kk,)), (TOPK_SCORES, "FP32", (kk,))]


def top_k_arrays(
    logits: np.ndarray, labels: Sequence[str], k: int = DEFAULT_TOP_K, scores: str = "softmax"
) -> tuple[np.ndarray, np.ndarray]:
    """float32 (N, C) logits -> (TOPK_LABELS object array (N, K) of ``bytes``, TOPK_SCORES float32
    (N, K)): the probabilities of the export's score function (``scores``: softmax, or sigmoid for SigLIP's
    zero-shot classes), best first, ``K = min(k, C)``, ties to the lower index
    (:func:`vitdeploy.runtime.postprocess.top_k`). A label missing from ``labels`` is the index."""
    from ..runtime.postprocess import probabilities, top_k

    logits = np.asarray(logits)
    n, c = logits.shape
    kk = max(1, min(int(k), c))
    probs = probabilities(logits, scores)
    names = np.empty((n, kk), dtype=object)
    best = np.empty((n, kk), dtype=np.float32)
    for r, row in enumerate(probs):
        for j, (idx, score) in enumerate(top_k(row, kk)):
            names[r, j] = (labels[idx] if 0 <= idx < len(labels) else str(idx)).encode("utf-8")
            best[r, j] = score
    return names, best


def classify(values: np.ndarray, count: int) -> np.ndarray:
    """Triton's classification of a numeric output: per row the ``count`` largest as ``b"value:index"`` (the
    value with 6 decimals), largest first; BYTES (N, count)."""
    count = max(1, min(int(count), values.shape[1]))
    order = np.argsort(-values, axis=1, kind="stable")[:, :count]
    rows = [[f"{row[i]:f}:{i}".encode() for i in idx] for row, idx in zip(values, order)]
    return np.array(rows, dtype=object).reshape(len(values), count)


def output_arrays(
    logits: np.ndarray,
    labels: Sequence[str],
    k: int,
    classification: dict[str, int],
    embedding: bool = False,
    patch_tokens: np.ndarray | None = None,
    scores: str = "softmax",
) -> dict[str, tuple[str, np.ndarray]]:
    """Every output of a v2 answer as (datatype, array): LOGITS, TOPK_LABELS, TOPK_SCORES (by ``scores``, the
    export's score function; an embedding model: its vectors as EMBEDDINGS, and ``patch_tokens`` (N, P, D) as
    PATCH_TOKENS where computed), an output asked for with class_count classified (BYTES)."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    if embedding:
        tensors = {EMBEDDINGS: ("FP32", logits)}
        if patch_tokens is not None:
            tensors[PATCH_TOKENS] = ("FP32", np.ascontiguousarray(patch_tokens, dtype=np.float32))
    else:
        labels_arr, best = top_k_arrays(logits, labels, k, scores)
        tensors = {LOGITS: ("FP32", logits), TOPK_LABELS: ("BYTES", labels_arr), TOPK_SCORES: ("FP32", best)}
    for name, count in classification.items():
        tensors[name] = ("BYTES", classify(tensors[name][1], count))
    return tensors


__all__ = [
    "CONFIG_TYPES",
    "DEFAULT_TOP_K",
    "EMBEDDINGS",
    "LOGITS",
    "OUTPUTS",
    "PATCH_TOKENS",
    "TOPK_LABELS",
    "TOPK_SCORES",
    "classify",
    "default_outputs",
    "output_arrays",
    "output_tensors",
    "served_outputs",
    "top_k_arrays",
]
