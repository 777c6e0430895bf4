"""The gate of `vitdeploy rollout` on shadowed live traffic: what a candidate answered to the live requests copied
to it, beside the live version's answers to the same requests.

By default a candidate passes when no shadowed request failed and (with ``max_slowdown``) its latency is within
bounds; whether it is faithful to its own export is judged before the shadow, on its export's validation images
(client/served_check.py, as `validate --url` judges a server). Its agreement with the live version - top-1
agreement, the requests whose top-1 flipped, the lowest cosine (an embedding model: the lowest cosine) - is
measured and reported, and gates only when asked: ``min_agreement`` (top-1 agreement, or an embedding's lowest
cosine, at least that) or ``same_model`` (the candidate must answer as the live version does, within the
thresholds of the candidate's backend - the export's own validation of that backend, else the config's
``validation.<precision>`` - loosened where the live version's backend is allowed more: a re-export, another
precision or backend of the same weights). A retrained model disagrees with the old one by design: only those
two options refuse it.

What the first answers already prove decides early (:func:`~vitdeploy.export.compare.proven_failure`: a largest
difference past its threshold stays past it, an agreement too low to be made up by the remaining budget), so a
failing candidate is rolled back within its shadow budget, usually at its first answers. Latency: the time each
version spent on the same requests (decoding, batching, the model call), p50 and p99, always reported; a gate only
with ``max_slowdown``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ...base.output_spec import EMBEDDING
from ...base.vocab import BACKEND_KINDS
from ...export.compare import compare, output_metrics, proven_failure


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


def shadow_thresholds(
    samples: Sequence[Mapping[str, Any]], manifest_validation: Mapping[str, Any] | None, validation: Any
) -> dict[str, float]:
    """The thresholds the shadowed answers are compared with the live version's by: the candidate backend's (its
    export's own validation, else ``validation``), loosened to the live backend's where those are looser; the
    backends are the ones the samples name."""
    cand = next(s["backend"] for s in samples if s.get("backend"))
    live = next((s["live_backend"] for s in samples if s.get("live_backend")), None)
    mine = backend_thresholds(manifest_validation, cand, validation)
    theirs = backend_thresholds(None, live, validation) if live else None
    return gate_thresholds(mine, theirs)


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


def agreement(live: np.ndarray, cand: np.ndarray, kind: str) -> dict[str, float]:
    """The candidate's agreement with the live version on the same rows: top-1 agreement and the rows whose top-1
    flipped (a classifier), the lowest cosine."""
    metrics, flipped = output_metrics(live, cand, kind)
    out = {"cosine": metrics["cosine"]}
    if kind != EMBEDDING:
        out.update(top1_agreement=metrics["top1_agreement"], flips=float(len(flipped)))
    return out


def agreement_thresholds(
    kind: str, thresholds: Mapping[str, float], min_agreement: float | None, same_model: bool
) -> dict[str, float]:
    """What the agreement with the live version must reach: ``thresholds`` with ``same_model``, a floor on the
    top-1 agreement (an embedding's lowest cosine) with ``min_agreement``, else nothing."""
    limits = dict(thresholds) if same_model else {}
    if min_agreement is not None:
        key = "min_cosine" if kind == EMBEDDING else "min_top1_agreement"
        limits[key] = max(limits.get(key, float(min_agreement)), float(min_agreement))
    return limits


def judge_shadow(
    samples: Sequence[Mapping[str, Any]],
    thresholds: Mapping[str, float],
    kind: str,
    budget: int,
    final: bool = False,
    max_slowdown: float | None = None,
    min_agreement: float | None = None,
    same_model: bool = False,
) -> ShadowVerdict:
    """Judge the shadowed requests so far (``samples``: the registry's records) of a budget of ``budget``;
    ``final``: no more will come (the budget spent, or its time up). Undecided while more are needed and
    nothing is proven yet. ``thresholds`` gate only with ``same_model`` (see the module's docstring)."""
    failed = next((s["error"] for s in samples if s.get("error")), None)
    if failed:
        return ShadowVerdict(False, True, f"the candidate failed a shadowed request: {failed}", _figures(samples, 0))
    if not samples:
        return ShadowVerdict(False, final, "no live request was shadowed to the candidate", _figures(samples, 0))
    live = np.concatenate([np.asarray(s["live"], dtype=np.float64) for s in samples])
    cand = np.concatenate([np.asarray(s["candidate"], dtype=np.float64) for s in samples])
    figures = _figures(samples, len(live))
    limits = agreement_thresholds(kind, thresholds, min_agreement, same_model)
    if live.shape != cand.shape:  # another head: agreement cannot be measured
        what = "vectors of" if kind == EMBEDDING else "logits for"
        reason = f"it answers {what} {cand.shape[1]} values a row, the live version {live.shape[1]}: another model"
        if limits:
            return ShadowVerdict(False, True, reason, figures)
        figures["agreement"], figures["note"] = None, reason
    else:
        figures["agreement"] = agreement(live, cand, kind)
        figures["thresholds"] = limits
    if limits and not final and len(samples) < budget:
        total = max(len(live), int(round(len(live) * budget / len(samples))))
        proof = proven_failure(live, cand, total, limits, kind)
        if proof is not None:
            figures["metrics"] = dict(proof.metrics)
            return ShadowVerdict(False, True, proof.headline, figures)
    if not final and len(samples) < budget:
        return ShadowVerdict(False, False, "", figures)
    if limits:
        result = compare(live, cand, limits, kind)
        figures["metrics"] = dict(result.metrics)
        if not result.passed:
            return ShadowVerdict(False, True, result.headline, figures)
    slower = _slower(figures, max_slowdown)
    return ShadowVerdict(not slower, True, slower, figures)


__all__ = [
    "ShadowVerdict",
    "agreement",
    "agreement_thresholds",
    "backend_thresholds",
    "gate_thresholds",
    "judge_shadow",
    "shadow_thresholds",
]
