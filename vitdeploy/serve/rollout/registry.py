"""The rollout registry: which version of each model is live, which versions exist, where shadow copies go, and
each rollout's history; and the proxies' cached read of it (:class:`RoutingTable`).

:class:`RolloutRegistry` is one named detached Ray actor (:data:`REGISTRY` in namespace :data:`NAMESPACE`, no
CPU) that `vitdeploy rollout` creates; it also keeps the candidates' packed exports (it owns them in Ray's object
store, so they outlive the rollout's process). The proxy's guard (serve/proxy_guard.py) and the gRPC routing
(serve/kserve_grpc.py) read its :meth:`~RolloutRegistry.routing` through :data:`ROUTING` (cached
:data:`~.routes.ROUTING_TTL_S`; a cluster where no rollout ran has no registry); routes.py says what the guard
does with it.

No Ray at import: the registry is a plain class (Ray makes an actor of it in :func:`registry_actor`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from ...base.errors import first_line
from .routes import ROUTING_TTL_S, version_app, version_of_app, version_route

log = logging.getLogger(__name__)

NAMESPACE = "vitdeploy"
REGISTRY = "vitdeploy-rollout"
#: a rollout whose process has not been heard of for this long is abandoned: the next one removes its candidate
ABANDONED_S = 30.0


def _new_model(model: str, running: Mapping[str, str]) -> dict[str, Any]:
    """A model first seen by the registry: its running applications as versions, the bare route's one live."""
    versions = {}
    for app, route in running.items():
        number = version_of_app(model, app)
        if number is not None:
            versions[number] = {"app": app, "route": route, "state": "live", "sha": None, "backend": None}
    live = 1 if 1 in versions else max(versions, default=1)
    for number, entry in versions.items():
        entry["state"] = "live" if number == live else "left"
    return {"versions": versions, "live": live, "next": max(versions, default=1) + 1, "rollout": None}


def _entry(model: str, version: Mapping[str, Any], verdict: str, reason: str, now: float) -> dict[str, Any]:
    keys = ("version", "sha", "backend", "export")
    return {"model": model, **{k: version.get(k) for k in keys}, "verdict": verdict, "reason": reason, "ended": now}


class RolloutRegistry:
    """The state of every rollout on one Ray cluster (see the module's docstring). Ray runs it as an actor, one
    method at a time; every method returns plain data (a refusal is ``{"refused": reason}``, never an exception
    across Ray)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._models: dict[str, dict[str, Any]] = {}
        self._history: list[dict[str, Any]] = []
        self._samples: dict[str, list[dict[str, Any]]] = {}
        self._bundles: dict[str, list[Any]] = {}

    # ---------------------------------------------------------------- a rollout's steps

    def begin(self, model: str, running: Mapping[str, str], candidate: Mapping[str, Any]) -> dict[str, Any]:
        """Start a rollout of ``model`` (``running``: its Serve applications now, {app: route}): the candidate's
        version number, and the abandoned rollout (its process gone) whose candidate is to be removed first."""
        state = self._models.get(model)
        busy = state["rollout"] if state else None
        if busy is not None and self._clock() - busy["beat"] < ABANDONED_S:
            return {"refused": f"a rollout of {model} v{busy['version']} is in progress; wait for it to end"}
        if state is not None:  # versions whose application is gone (a restarted server) are forgotten
            state["versions"] = {n: e for n, e in state["versions"].items() if e["app"] in running}
        if state is None or state["live"] not in state["versions"]:
            fresh = _new_model(model, running)
            fresh["next"] = max(fresh["next"], state["next"] if state else 2)
            state = self._models[model] = fresh
        if not state["versions"]:
            return {"refused": f"no application of model {model!r} runs on this cluster"}
        abandoned, rollout = None, state["rollout"]
        if rollout is not None:
            left = state["versions"].get(rollout["version"])
            if left is not None:
                left["state"] = "leaving"
            abandoned = dict(left or {}, version=rollout["version"])
            reason = f"its rollout process was not heard of for {ABANDONED_S:g} s"
            self._history.append(_entry(model, abandoned, "rolled back", reason, self._clock()))
        number = state["next"]
        state["next"] += 1
        state["versions"][number] = {
            **dict(candidate),
            "app": version_app(model, number),
            "route": version_route(model, number),
            "state": "starting",
        }
        now = self._clock()
        state["rollout"] = {"version": number, "beat": now, "started": now, "shadow": None, "count": 0, "errors": 0}
        self._samples[model] = []
        return {"version": number, "abandoned": abandoned, "live": state["live"]}

    def ready(self, model: str, version: int) -> None:
        """The candidate runs: it is listed among the versions, and reachable at its route."""
        self._models[model]["versions"][version]["state"] = "candidate"

    def keep(self, app: str, bundle: Any) -> list[Any]:
        """Put ``bundle`` (a packed export) in Ray's object store, owned here, so that replicas started later (a
        replacement) still find it after the rollout's process exits; ``[ref]`` (a list: Ray passes it on)."""
        import ray

        self._bundles[app] = [ray.put(bundle)]
        return self._bundles[app]

    def start_shadow(self, model: str, budget: int, timeout_s: float, seconds: float) -> dict[str, Any]:
        """Copy the next ``budget`` unversioned inferences (for at most ``seconds``) to the candidate; each copy
        is given ``timeout_s`` to be answered."""
        rollout = self._rollout(model)
        if rollout is None:
            return {"refused": f"no rollout of {model!r} is in progress"}
        app = self._models[model]["versions"][rollout["version"]]["app"]
        until = self._clock() + seconds
        rollout["shadow"] = {"app": app, "budget": int(budget), "timeout_s": float(timeout_s), "until": until}
        return {"app": app}

    def record(self, model: str, version: int, sample: Mapping[str, Any]) -> None:
        """One shadow copy's outcome, from the live replica that sent it (kept up to the budget)."""
        rollout = self._rollout(model)
        if rollout is None or rollout["version"] != version or rollout["shadow"] is None:
            return
        samples = self._samples.setdefault(model, [])
        if len(samples) >= rollout["shadow"]["budget"]:
            return
        samples.append(dict(sample))
        rollout["count"] += 1
        rollout["errors"] += 1 if sample.get("error") else 0
        if len(samples) >= rollout["shadow"]["budget"]:
            rollout["shadow"] = None  # the budget is spent: the guards stop tagging at their next refresh

    def progress(self, model: str) -> dict[str, Any]:
        """How far the shadow is (``count``, ``errors``, ``shadowing``); the rollout's process is alive (beat)."""
        rollout = self._rollout(model)
        if rollout is None:
            return {"count": 0, "errors": 0, "shadowing": False}
        rollout["beat"] = self._clock()
        shadow = rollout["shadow"]
        shadowing = shadow is not None and self._clock() < shadow["until"]
        return {"count": rollout["count"], "errors": rollout["errors"], "shadowing": shadowing}

    def samples(self, model: str, start: int = 0) -> list[dict[str, Any]]:
        """The shadow copies' outcomes from the ``start``-th on (a rollout reads them as they come)."""
        return list(self._samples.get(model, [])[start:])

    def stop_shadow(self, model: str) -> None:
        rollout = self._rollout(model)
        if rollout is not None:
            rollout["shadow"] = None

    def promote(self, model: str, version: int) -> None:
        """Unversioned requests go to ``version`` from the guards' next refresh; the old live one is leaving."""
        state = self._models[model]
        state["versions"][state["live"]]["state"] = "leaving"
        state["versions"][version]["state"] = "live"
        state["live"] = version

    def drop(self, model: str, version: int) -> None:
        """``version`` is gone (rolled back, or drained after a promotion): forget it and its packed export."""
        state = self._models.get(model)
        entry = state["versions"].pop(version, None) if state else None
        if entry is not None:
            self._bundles.pop(entry["app"], None)

    def finish(self, model: str, entry: Mapping[str, Any]) -> None:
        """The rollout is over: ``entry`` (version, sha, verdict, reason, figures) joins the history."""
        state = self._models.get(model)
        if state is not None:
            state["rollout"] = None
        self._samples.pop(model, None)
        self._history.append({"model": model, **dict(entry)})

    def forget(self, model: str) -> None:
        """The model's server stopped: its versions go (the history stays)."""
        state = self._models.pop(model, None)
        for entry in (state or {}).get("versions", {}).values():
            self._bundles.pop(entry["app"], None)

    # ---------------------------------------------------------------- what others read

    def routing(self) -> dict[str, dict[str, Any]]:
        """What the proxy's guard needs, per model: the live version's route and application, the versions and
        their applications, the shadow target (or None)."""
        out = {}
        for model, state in self._models.items():
            rollout, shadow = state["rollout"], None
            if rollout and rollout["shadow"] and self._clock() < rollout["shadow"]["until"]:
                shadow = {k: rollout["shadow"][k] for k in ("app", "timeout_s")}
            live = state["versions"].get(state["live"])
            if live is None:
                continue
            apps = {str(n): e["app"] for n, e in state["versions"].items() if e["state"] != "starting"}
            out[model] = {
                "live": live["route"],
                "live_app": live["app"],
                "versions": sorted(int(n) for n in apps),
                "apps": apps,
                "shadow": shadow,
            }
        return out

    def status(self) -> dict[str, Any]:
        """Every model's versions and rollout in progress, and the history, for `vitdeploy rollout --status`."""
        models = {
            model: {
                "live": state["live"],
                "versions": {str(n): dict(e) for n, e in sorted(state["versions"].items())},
                "rollout": None if state["rollout"] is None else {"version": state["rollout"]["version"]},
            }
            for model, state in self._models.items()
        }
        return {"models": models, "history": list(self._history)}

    def _rollout(self, model: str) -> dict[str, Any] | None:
        state = self._models.get(model)
        return None if state is None else state["rollout"]


def registry_actor(create: bool = False) -> Any:
    """The registry's actor handle on the Ray this process is connected to; None when there is none and
    ``create`` is False."""
    import ray

    if not create:
        try:
            return ray.get_actor(REGISTRY, namespace=NAMESPACE)
        except ValueError:
            return None
    actor = ray.remote(num_cpus=0, max_restarts=0)(RolloutRegistry)
    return actor.options(name=REGISTRY, namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote()


# ------------------------------------------------------------------------------------------------ who reads it


class RoutingTable:
    """The rollout registry's routing (:meth:`RolloutRegistry.routing`), read at most once per ROUTING_TTL_S, one read
    at a time; while the registry cannot be read the last table stands, so no request is sent to a version that
    left."""

    def __init__(self, read: Callable[[], Awaitable[dict[str, Any] | None]] | None = None) -> None:
        self._read = read or _read_registry
        self._table: dict[str, Any] = {}
        self._at = -float("inf")
        self._lock = asyncio.Lock()

    async def table(self) -> dict[str, Any]:
        if time.monotonic() - self._at < ROUTING_TTL_S:
            return self._table
        async with self._lock:
            if time.monotonic() - self._at >= ROUTING_TTL_S:
                try:
                    table = await asyncio.wait_for(self._read(), timeout=ROUTING_TTL_S * 5)
                except Exception as exc:  # noqa: BLE001 - Ray's errors: keep the last table, try again later
                    log.warning("the rollout registry could not be read (%s); routing as before", first_line(exc))
                else:
                    self._table = table if table is not None else {}
                self._at = time.monotonic()
        return self._table


_REGISTRY: list[Any] = []  # the registry's actor handle, once found (this process is Ray's proxy actor)


async def _read_registry() -> dict[str, Any] | None:
    """The registry's routing table; None when no rollout ever ran on this cluster (no registry)."""
    import ray

    if not ray.is_initialized():  # not inside Ray's proxy (a test of the guard alone): no rollout
        return None
    if not _REGISTRY:
        found = await asyncio.get_running_loop().run_in_executor(None, registry_actor)
        if found is None:
            return None
        _REGISTRY.append(found)
    try:
        return await _REGISTRY[0].routing.remote()
    except Exception:
        _REGISTRY.clear()  # a new registry (a restarted one) is looked up next time
        raise


#: the one routing table of a proxy process (its HTTP guard: serve/proxy_guard.py; its gRPC: serve/kserve_grpc.py)
ROUTING = RoutingTable()


__all__ = ["ABANDONED_S", "NAMESPACE", "REGISTRY", "ROUTING", "RolloutRegistry", "RoutingTable", "registry_actor"]
