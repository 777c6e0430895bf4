"""The server's own account of a load level: KServe v2 / Triton statistics (``GET /v2/models/<m>/stats``, or
``ModelStatistics`` over gRPC) read before and after, as perf_analyzer does, and the difference per request.

What a level adds: requests answered, the mean batch the server ran (inferences / executions) and the mean
milliseconds per request waiting in its queue and in compute input / infer / output. ``vitdeploy serve``
answers for the replica the request reached (one of several when there are several replicas); Triton for
the model named (an ensemble's own queue is its steps'). A server without statistics gives None, never an error.
"""

from __future__ import annotations

import http.client
import json
from typing import Any, Optional
from urllib.parse import urlsplit

from .clients import V2_GRPC, Target

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def read(target: Target) -> Optional[dict[str, Any]]:
    """The model's statistics entry, or None where the server does not expose them (or not to us)."""
    if not target.model:
        return None
    try:
        doc = _grpc_stats(target) if target.protocol == V2_GRPC else _http_stats(target)
        entries = doc.get("model_stats") or []
        return entries[0] if entries else None
    except Exception:  # noqa: BLE001 - statistics are extra: a server without them is still load-tested
        return None


def _http_stats(target: Target) -> dict[str, Any]:
    parts = urlsplit(target.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", f"{parts.path.rstrip('/')}/v2/models/{target.model}/stats", headers=target.headers())
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    return json.loads(body) if response.status == 200 else {}


def _grpc_stats(target: Target) -> dict[str, Any]:
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(target.url.split("://", 1)[-1].rstrip("/"))
    try:
        return client.get_inference_statistics(target.model, headers=target.headers(), as_json=True)
    finally:
        client.close()


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


__all__ = ["PHASES", "read", "delta"]
