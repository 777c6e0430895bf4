"""What to deploy, per target: from each backend's accuracy verdict and its speed on this machine.

Pure data in, data out (no files, no plotting): :func:`recommend` gets one :class:`Candidate` per backend
(its accuracy verdict against eager PyTorch, and its measured latency at batch 1 and best throughput where
a benchmark ran) and answers, per target, which backend wins among those that passed their thresholds:

* ``latency``: the lowest p50 latency at batch 1 here;
* ``throughput``: the most images per second here (at any batch size measured);
* ``gpu``: the TensorRT engine when one was built and validated (``trt``, then ``trt-int8``), else a CUDA
  backend that passed; none here when there is no GPU backend.

A backend that failed its thresholds is never recommended, however fast. Ties (speeds within
:data:`TIE`) go to the more accurate backend (higher top-1 agreement, then cosine, then lower max
|logit diff|). When no backend passed, :attr:`Recommendation.nothing` says so and the page leads with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...base.vocab import TORCH_FP16, TRT_INT8

TIE = 0.03  # speeds within 3% of each other are a tie: the more accurate backend wins
GPU_BACKENDS = ("trt", TRT_INT8, TORCH_FP16)


@dataclass(frozen=True)
class Candidate:
    """One backend as the report knows it."""

    name: str
    passed: bool  # within its precision's validation thresholds (the reference counts as passed)
    top1_agreement: float = 1.0
    recall_at_k: float | None = None  # an embedding model's neighbour agreement (it has no top-1)
    cosine: float = 1.0
    max_abs_diff: float = 0.0
    latency_ms: float | None = None  # p50 at batch 1 here (None: not measured)
    images_per_s: float | None = None  # best throughput here (None: not measured)
    gpu: bool = False
    reference: bool = False  # eager PyTorch itself (the baseline, recommended only if nothing else passed)

    def accuracy_key(self) -> tuple[float, float, float]:
        agreement = self.top1_agreement if self.recall_at_k is None else self.recall_at_k
        return (agreement, self.cosine, -self.max_abs_diff)


@dataclass(frozen=True)
class Pick:
    target: str  # "latency" | "throughput" | "gpu"
    backend: str
    why: str
    cost: str  # what it gives up in accuracy against eager PyTorch


@dataclass
class Recommendation:
    picks: list[Pick] = field(default_factory=list)
    nothing: str = ""  # why nothing can be recommended (no backend passed), else ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"picks": [vars(p) for p in self.picks], "nothing": self.nothing or None, "notes": self.notes}


def _cost(c: Candidate) -> str:
    if c.reference:
        return "none: it is the reference"
    if c.recall_at_k is not None:  # an embedding model
        return f"neighbour recall {c.recall_at_k:.1%}, worst cosine {c.cosine:.6f}, max |diff| {c.max_abs_diff:.3g}"
    return (
        f"top-1 agreement {c.top1_agreement:.1%}, worst cosine {c.cosine:.5f}, max |logit diff| {c.max_abs_diff:.3g}"
    )


def _fastest(cands: list[Candidate], value: Any, higher_is_better: bool) -> Candidate | None:
    """The best by ``value`` among ``cands``, ties (within TIE) broken by accuracy."""
    measured = [c for c in cands if value(c) is not None and value(c) > 0]
    if not measured:
        return None
    best = max(value(c) for c in measured) if higher_is_better else min(value(c) for c in measured)

    def close(c: Candidate) -> bool:
        v = value(c)
        return v >= best * (1 - TIE) if higher_is_better else v <= best * (1 + TIE)

    return max((c for c in measured if close(c)), key=Candidate.accuracy_key)


def recommend(candidates: list[Candidate], auto: tuple[str, str] | None = None) -> Recommendation:
    """``auto``: (the backend auto runs on this CPU, its figures in words), shown as the ``auto`` pick when that
    backend passed (runtime/auto_choice.py chooses only among those that passed their gates)."""
    rec = Recommendation()
    passed = [c for c in candidates if c.passed and not c.reference]
    failed = [c.name for c in candidates if not c.passed]
    if not passed:
        rec.nothing = (
            "no backend passed its validation thresholds"
            + (f" ({', '.join(failed)} failed)" if failed else "")
            + ": nothing but eager PyTorch can be trusted to give the checkpoint's answers"
        )
        return rec
    cpu = [c for c in passed if not c.gpu]
    chosen = next((c for c in cpu if auto and c.name == auto[0]), None)
    if chosen is not None:
        why = f"what backend auto (predict, serve, batch-predict) runs on this CPU: {auto[1]}"
        rec.picks.append(Pick("auto", chosen.name, why, _cost(chosen)))
    fast = _fastest(cpu, lambda c: c.latency_ms, higher_is_better=False)
    if fast is not None:
        rec.picks.append(
            Pick("latency", fast.name, f"lowest p50 at batch 1 here: {fast.latency_ms:.2f} ms", _cost(fast))
        )
    busy = _fastest(cpu, lambda c: c.images_per_s, higher_is_better=True)
    if busy is not None:
        rec.picks.append(Pick("throughput", busy.name, f"most images/s here: {busy.images_per_s:.1f}", _cost(busy)))
    if fast is None and busy is None:
        best = max(cpu or passed, key=Candidate.accuracy_key)
        rec.picks.append(
            Pick("accuracy", best.name, "the most accurate that passed (no speed measured here)", _cost(best))
        )
        rec.notes.append("no speed was measured here: run `vitdeploy bench` (or `vitdeploy report --bench auto`)")
    gpu = [c for c in passed if c.gpu]
    engine = next((c for name in GPU_BACKENDS for c in gpu if c.name == name), None)
    if engine is not None:
        rec.picks.append(Pick("gpu", engine.name, "built and validated on this GPU", _cost(engine)))
    else:
        rec.notes.append("no GPU backend passed here (no TensorRT engine was built and validated on this machine)")
    if failed:
        rec.notes.append(f"never recommended, however fast: {', '.join(failed)} (failed their thresholds)")
    return rec


def serve_command(backend: str, artifacts: str) -> str:
    """The command that serves ``backend``'s artifact."""
    if backend in ("trt", TRT_INT8):
        return f"vitdeploy triton-repo -a {artifacts} -o repository (or: vitdeploy serve -a {artifacts} -b {backend})"
    return f"vitdeploy serve -a {artifacts} -b {backend}"


__all__ = ["Candidate", "Pick", "Recommendation", "TIE", "recommend", "serve_command"]
