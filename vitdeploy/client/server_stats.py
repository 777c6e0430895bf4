"""The server's own account of a load level: KServe v2 / Triton statistics (``GET /v2/models/<m>/stats``, or
``ModelStatistics`` over gRPC) read before and after, as perf_analyzer does, and the difference per request.

What a level adds: requests answered, the mean batch the server ran (inferences / executions) and the mean
milliseconds per request waiting in its queue and in compute input / infer / output. ``vitdeploy serve``
answers for the replica the request reached (one of several when there are several replicas); Triton for
the model named (an ensemble's own queue is its steps'). A server without statistics gives None, never an error.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .protocols import OK, Target, model_document

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def read(target: Target) -> Optional[dict[str, Any]]:
    """The model's statistics entry, or None where the server does not expose them (or not to us)."""
    if not target.model:
        return None
    try:
        status, doc = model_document(target, target.model, "stats", timeout_s=10)
        entries = (doc.get("model_stats") or []) if status in OK else []
        return entries[0] if entries else None
    except Exception:  # noqa: BLE001 - statistics are extra: a server without them is still load-tested
        return None


def read_settled(
    target: Target, before: Optional[dict[str, Any]], answered: int, settle_s: float = 2.0
) -> Optional[dict[str, Any]]:
    """The statistics after a level, read again (for up to ``settle_s``) until they count every request the
    client saw answered: Triton records an ensemble's success after its response has left, so a read right
    after the last answer can miss the last request or two."""
    deadline = time.monotonic() + settle_s
    after = read(target)
    while after is not None and before is not None and time.monotonic() < deadline:
        if _stat(after, "success")[0] - _stat(before, "success")[0] >= answered:
            break
        time.sleep(0.02)
        after = read(target)
    return after


def _stat(entry: dict[str, Any], key: str) -> tuple[int, int]:
    s = (entry.get("inference_stats") or {}).get(key) or {}
    return int(s.get("count", 0) or 0), int(s.get("ns", 0) or 0)


def delta(before: Optional[dict[str, Any]], after: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """What the level added to the server's statistics: counts, mean batch, mean ms per request per phase."""
    if before is None or after is None:
        return None
    ok = _stat(after, "success")[0] - _stat(before, "success")[0]
    infers = int(after.get("inference_count", 0) or 0) - int(before.get("inference_count", 0) or 0)
    execs = int(after.get("execution_count", 0) or 0) - int(before.get("execution_count", 0) or 0)
    out: dict[str, Any] = {
        "requests": ok,
        "failed": _stat(after, "fail")[0] - _stat(before, "fail")[0],
        "mean_batch": round(infers / execs, 2) if execs > 0 else None,
    }
    for phase in PHASES:
        ns = _stat(after, phase)[1] - _stat(before, phase)[1]
        out[f"{phase}_ms"] = round(ns / ok / 1e6, 3) if ok > 0 else None
    return out


__all__ = ["PHASES", "read", "read_settled", "delta"]
