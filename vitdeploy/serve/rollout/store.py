"""Where the rollout registry's state lives so that routing survives the registry: Ray's GCS key-value store.

The registry (registry.py) writes its whole state - every model's versions, which one is live, the
rollout in progress with its lease and phase, the history - as one JSON document under :data:`STATE_KEY` in
namespace :data:`NAMESPACE`, before each of its methods returns. So

* a registry that died (or was killed) and is started again reads it back and goes on where it was;
* the proxies' guards never ask the registry where to route: they read the document (:func:`read_routing`,
  a GCS read) and derive the table from it (:func:`routing_table`), so a dead registry, or a proxy started after
  it died, still sends a promoted model's traffic to the version that is live.

The GCS keeps the document for the cluster's life (and across a GCS restart where the cluster has GCS fault
tolerance). What it does not keep: the shadow copies' outcomes (a registry that restarts mid-shadow forgets them;
that rollout then runs out of time and is rolled back) and the candidates' packed exports in Ray's object store.

The GCS's key-value store (the one Ray Serve keeps its own checkpoints in) is private Ray API: it is reached through
base/ray_private.py.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from ...base.ray_private import gcs_kv_get, gcs_kv_put

NAMESPACE = "vitdeploy"
STATE_KEY = "rollout-registry"


class MemoryStore:
    """The registry's state kept in this process only (the plain class in tests; a second registry given the
    same store reads what the first wrote, as a restarted actor reads the GCS's)."""

    def __init__(self) -> None:
        self.data: Optional[bytes] = None

    def load(self) -> Optional[dict[str, Any]]:
        return None if self.data is None else json.loads(self.data)

    def save(self, doc: Mapping[str, Any]) -> None:
        self.data = json.dumps(doc, default=str).encode()


class GcsStore:
    """The registry's state in Ray's GCS key-value store (needs this process connected to Ray)."""

    def load(self) -> Optional[dict[str, Any]]:
        data = gcs_kv_get(STATE_KEY, NAMESPACE)
        return json.loads(data) if data else None

    def save(self, doc: Mapping[str, Any]) -> None:
        gcs_kv_put(STATE_KEY, json.dumps(doc, default=str).encode(), NAMESPACE)


def routing_table(doc: Optional[Mapping[str, Any]], now: float) -> dict[str, dict[str, Any]]:
    """What the proxy's guard needs, per model, from the registry's stored state: the live version's route and
    application, the versions that answer (a candidate still starting is not listed) with their applications,
    the shadow target while a shadow runs (else None), and during a promotion on a full cluster the version that
    answers a part of unversioned requests (``split``: its route, application and ``share``; else None)."""
    out: dict[str, dict[str, Any]] = {}
    for model, state in ((doc or {}).get("models") or {}).items():
        versions = {str(n): e for n, e in state["versions"].items()}
        live = versions.get(str(state["live"]))
        if live is None:
            continue
        rollout, shadow = state.get("rollout"), None
        if rollout and rollout.get("shadow") and now < float(rollout["shadow"]["until"]):
            shadow = {k: rollout["shadow"][k] for k in ("app", "timeout_s")}
        split = dict(rollout["split"]) if rollout and rollout.get("split") else None
        apps = {n: e["app"] for n, e in versions.items() if e["state"] != "starting"}
        out[model] = {
            "live": live["route"],
            "live_app": live["app"],
            "versions": sorted(int(n) for n in apps),
            "apps": apps,
            "shadow": shadow,
            "split": split,
        }
    return out


def read_routing(now: float) -> Optional[dict[str, dict[str, Any]]]:
    """The routing table from the stored state, read from the GCS (blocking: call it off an event loop); None when
    this process is not on Ray or no rollout ever ran on this cluster."""
    import ray

    if not ray.is_initialized():  # not inside Ray's proxy (a test of the guard alone): no rollout
        return None
    doc = GcsStore().load()
    return None if doc is None else routing_table(doc, now)


__all__ = ["NAMESPACE", "STATE_KEY", "GcsStore", "MemoryStore", "read_routing", "routing_table"]
