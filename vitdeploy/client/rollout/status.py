"""`vitdeploy rollout --status`: what the rollout registry (serve/rollout/registry.py) says - every model's versions,
the rollout in progress with its phase and lease, the history - after converging what rollouts whose lease expired
left (lease.py); and the gate's figures in one clause (:func:`summary`), as a rollout's last line says them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ...serve.rollout.registry import PROMOTED, registry_actor
from .lease import connect, converge_all


def summary(figures: dict[str, Any]) -> str:
    """The gate's figures in one clause: faithfulness, requests, agreement with the live version, latencies."""
    parts = []
    faithful = figures.get("faithful") or {}
    if faithful.get("images"):
        said = f", top-1 {faithful['top1_agreement']:.0%}" if faithful.get("top1_agreement") is not None else ""
        parts.append(f"faithful to its export ({faithful['images']} images{said})")
    parts.append(f"{figures.get('requests', 0)} shadowed requests")
    agreed = figures.get("agreement") or {}
    if "top1_agreement" in agreed:
        parts.append(f"top-1 agreement {agreed['top1_agreement']:.1%} ({agreed['flips']:.0f} flipped)")
    if "cosine" in agreed:
        parts.append(f"lowest cosine {agreed['cosine']:.6f}")
    lat = figures.get("latency_ms") or {}
    if lat.get("live") and lat.get("candidate"):
        parts.append(f"p50 {lat['candidate']['p50']:.1f} ms (live {lat['live']['p50']:.1f} ms)")
    return ", ".join(parts)


def rollout_status(address: Optional[str], progress: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """The registry's account: every model's versions, the rollout in progress and its phase, and the rollouts'
    history ({} when none ever ran); first, what rollouts whose lease expired left is removed (``converged``:
    what was done)."""
    ray = connect(address, progress)
    registry = registry_actor()
    if registry is None:
        return {"models": {}, "history": []}
    done = converge_all(ray, registry)
    return {**ray.get(registry.status.remote()), "converged": done}


def format_status(status: dict[str, Any], model: Optional[str] = None) -> list[str]:
    """`vitdeploy rollout --status` as lines: what was converged, each model's live version and versions (and the
    rollout in progress), then the history."""
    lines = [line for line in status.get("converged") or [] if not model or line.startswith(f"{model}: ")]
    for name, state in sorted(status.get("models", {}).items()):
        if model and name != model:
            continue
        versions = ", ".join(f"v{n} {e['state']}" for n, e in state["versions"].items())
        lines.append(f"{name}: live v{state['live']} ({versions})")
        rollout = state.get("rollout")
        if rollout:
            what = f"v{rollout['version']}" if rollout.get("version") else "a clean-up"
            lease = f"its lease has {rollout['lease_s']:.0f} s left" if rollout["lease_s"] > 0 else "its lease expired"
            lines.append(f"{name}: rollout of {what} in progress: {rollout['phase']}, {lease}")
    history = [h for h in status.get("history", []) if not model or h.get("model") == model]
    if not history:
        return lines + ["no rollout yet"]
    lines.append(f"{'model':<16} {'version':>7}  {'export':<12}  {'backend':<8}  {'when':<16}  verdict")
    for h in history:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(h.get("ended") or 0))
        sha = str(h.get("sha") or "?")[:12]
        line = f"{h['model']:<16} {'v' + str(h['version']):>7}  {sha:<12}  {str(h.get('backend')):<8}  {when:<16}  "
        figures = h.get("figures") or {}
        why = summary(figures) if h["verdict"] == PROMOTED and figures else h.get("reason", "")
        lines.append(f"{line}{h['verdict']}: {why}")
    return lines


__all__ = ["format_status", "rollout_status", "summary"]
