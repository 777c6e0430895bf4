"""The gate of `vitdeploy rollout`: a candidate's answers to shadowed live requests against the live version's.

Both versions answered the same requests (the live replica copied each to the candidate: serve/rollout/shadow.py).
Their rows (logits, or an embedding model's vectors) are compared by export/compare.py's comparator, as
`validate` compares a backend with eager PyTorch: the same metrics, under the thresholds of the candidate's
backend - the export's own validation of that backend (its manifest), else the config's
``validation.<precision>`` - loosened where the live version's backend is allowed more (each version may drift
from eager PyTorch by its own set). Any shadowed request the candidate failed, refused or left unanswered fails
it. What the first answers already prove decides early (:func:`~vitdeploy.export.compare.proven_failure`: a
largest difference past its threshold stays past it), so a wrong candidate is rolled back within its shadow
budget, usually at its first answers. Latency: the time each version spent on the same requests (decoding,
batching, the model call), p50 and p99, always reported; a gate only with ``max_slowdown``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ...base.output_spec import EMBEDDING
from ...base.vocab import BACKEND_KINDS
from ...export.compare import compare, proven_failure


@dataclass
class ShadowVerdict:
    """``passed`` (promote) or not; ``decided`` False while more shadowed requests are needed; ``reason``: why,
    in one clause; ``figures``: requests and inputs compared, metrics, thresholds, latencies, backends."""

    passed: bool
    decided: bool
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def backend_thresholds(manifest_validation: Mapping[str, Any] | None, backend: str, validation: Any) -> dict:
    """The thresholds ``backend`` is judged by for an export: those its own validation used (the manifest's
    ``validation`` entries name their backend), else the config's ``validation.<the backend's precision>``."""
    for entry in (manifest_validation or {}).values():
        limits = entry.get("thresholds") if isinstance(entry, Mapping) else None
        if isinstance(limits, dict) and entry.get("backend") == backend:
            return {str(k): float(v) for k, v in limits.items()}
    kind = BACKEND_KINDS.get(backend)
    tolerance = getattr(validation, kind.precision if kind else "fp32")
    return {str(k): float(v) for k, v in tolerance.model_dump().items()}


def gate_thresholds(candidate: Mapping[str, float], live: Mapping[str, float] | None) -> dict[str, float]:
    """The candidate's thresholds, each loosened to the live version's where that one is looser (a ``min_``
    threshold is looser lower, a difference higher)."""
    out = dict(candidate)
    for key, value in (live or {}).items():
        if key not in out or key == "neighbours":
            continue
        out[key] = min(out[key], value) if key.startswith("min_") else max(out[key], value)
    return out


def _latency(samples: Sequence[Mapping[str, Any]], key: str) -> dict[str, float] | None:
    ns = [float(s[key]) for s in samples if s.get(key) is not None]
    if not ns:
        return None
    return {"p50": float(np.percentile(ns, 50)) / 1e6, "p99": float(np.percentile(ns, 99)) / 1e6}


def _figures(samples: Sequence[Mapping[str, Any]], rows: int) -> dict[str, Any]:
    live = next((s.get("live_backend") for s in samples if s.get("live_backend")), None)
    cand = next((s.get("backend") for s in samples if s.get("backend")), None)
    return {
        "requests": len(samples),
        "inputs": rows,
        "backends": {"live": live, "candidate": cand},
        "latency_ms": {"live": _latency(samples, "live_ns"), "candidate": _latency(samples, "candidate_ns")},
    }


def _slower(figures: Mapping[str, Any], max_slowdown: float | None) -> str:
    lat = figures["latency_ms"]
    if not max_slowdown or not lat["live"] or not lat["candidate"] or lat["live"]["p50"] <= 0:
        return ""
    ratio = lat["candidate"]["p50"] / lat["live"]["p50"]
    if ratio <= max_slowdown:
        return ""
    return f"its p50 latency is {ratio:.2f}x the live version's, over --max-slowdown {max_slowdown:g}"


def judge_shadow(
    samples: Sequence[Mapping[str, Any]],
    thresholds: Mapping[str, float],
    kind: str,
    budget: int,
    final: bool = False,
    max_slowdown: float | None = None,
) -> ShadowVerdict:
    """Judge the shadowed requests so far (``samples``: the registry's records) of a budget of ``budget``;
    ``final``: no more will come (the budget spent, or its time up). Undecided while more are needed and
    nothing is proven yet."""
    failed = next((s["error"] for s in samples if s.get("error")), None)
    if failed:
        return ShadowVerdict(False, True, f"the candidate failed a shadowed request: {failed}", _figures(samples, 0))
    if not samples:
        return ShadowVerdict(False, final, "no live request was shadowed to the candidate", _figures(samples, 0))
    live = np.concatenate([np.asarray(s["live"], dtype=np.float64) for s in samples])
    cand = np.concatenate([np.asarray(s["candidate"], dtype=np.float64) for s in samples])
    figures = _figures(samples, len(live))
    if live.shape != cand.shape:
        what = "vectors of" if kind == EMBEDDING else "logits for"
        reason = f"it answers {what} {cand.shape[1]} values a row, the live version {live.shape[1]}: another model"
        return ShadowVerdict(False, True, reason, figures)
    figures["thresholds"] = dict(thresholds)
    if not final and len(samples) < budget:
        total = max(len(live), int(round(len(live) * budget / len(samples))))
        proof = proven_failure(live, cand, total, thresholds, kind)
        if proof is None:
            return ShadowVerdict(False, False, "", figures)
        figures["metrics"] = dict(proof.metrics)
        return ShadowVerdict(False, True, proof.headline, figures)
    result = compare(live, cand, thresholds, kind)
    figures["metrics"] = dict(result.metrics)
    if not result.passed:
        return ShadowVerdict(False, True, result.headline, figures)
    slower = _slower(figures, max_slowdown)
    return ShadowVerdict(not slower, True, slower, figures)


__all__ = ["ShadowVerdict", "backend_thresholds", "gate_thresholds", "judge_shadow"]
