"""The rollout registry: which version of each model is live, which versions exist, where shadow copies go, each
rollout's lease and phase, and the history; and the proxies' cached read of its routing (:class:`RoutingTable`).

:class:`RolloutRegistry` is one named detached Ray actor (:data:`REGISTRY` in namespace :data:`~.store.NAMESPACE`,
no CPU, restarted by Ray when it dies) that `vitdeploy rollout` creates; it also keeps the candidates' packed
exports (it owns them in Ray's object store, so they outlive the rollout's process). Its state is written to Ray's
GCS (store.py) at every change: a registry started again reads it back.

A rollout holds its model's lease (:data:`LEASE_S`, renewed by its process all the while it runs) and records its
phase (:data:`PHASES`) at each step; whoever finds the lease expired (the next rollout, `rollout --status`) takes it
over and removes what the abandoned rollout left, never the live version (docs/serving.md says what a crash in
each phase leaves).

The proxy's guard (serve/proxy_guard.py) and the gRPC routing (serve/kserve_grpc.py) read the routing through
:data:`ROUTING` from that stored state (store.py's :func:`~.store.read_routing`, cached
:data:`~.routes.ROUTING_TTL_S`; a cluster where no rollout ran has none), so a dead registry never changes where
requests go; routes.py says what the guard does with it.

No Ray at import: the registry is a plain class (Ray makes an actor of it in :func:`registry_actor`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from ...base.errors import first_line
from .routes import ROUTING_TTL_S, version_app, version_of_app, version_route
from .store import NAMESPACE, GcsStore, MemoryStore, read_routing, routing_table

log = logging.getLogger(__name__)

REGISTRY = "vitdeploy-rollout"
#: a rollout's lease: renewed by its process all the while it runs; expired, the next rollout (or `rollout --status`)
#: takes it over and removes what the abandoned one left, never the live version
LEASE_S = 30.0
#: a rollout's phases, recorded at each step (what a crash in each leaves: docs/serving.md)
STARTING, CANDIDATE, SHADOW, PROMOTING, DRAINING = "starting", "candidate", "shadow", "promoting", "draining"
ROLLING_BACK, CONVERGING = "rolling-back", "converging"  # converging: `rollout --status` removing what one left
PHASES = (STARTING, CANDIDATE, SHADOW, PROMOTING, DRAINING, ROLLING_BACK, CONVERGING)
#: the states of a version that is not live and goes when a lease is taken over
LEAVING = ("starting", "candidate", "leaving")
PROMOTED, ROLLED_BACK = "promoted", "rolled back"
HISTORY_KEPT = 1000  # the rollouts the history keeps (the oldest go first)


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


def _fenced(model: str, rollout: Mapping[str, Any] | None) -> dict[str, Any]:
    """The refusal of a call whose holder no longer holds ``model``'s lease (another took it over, or none)."""
    now = f"{rollout['phase']} by another process" if rollout else "no rollout holds it now"
    return {"refused": f"this rollout of {model} lost its lease ({now}): it touches nothing more", "fenced": True}


class RolloutRegistry:
    """The state of every rollout on one Ray cluster (see the module's docstring). Ray runs it as an actor, one
    method at a time; every method returns plain data (a refusal is ``{"refused": reason}``, never an exception
    across Ray; ``"fenced": True`` when the caller's lease is no longer its own).

    A rollout holds its model's lease: a holder id (``holder``, the rollout process's own) and an expiry it renews
    (:meth:`renew`) all the while it runs; every call that changes the rollout's state names the holder and is
    refused for any other. Its phase (:data:`PHASES`) is recorded at each step, so that whoever takes an expired
    lease over knows what the abandoned rollout left: the version that is live stays, whatever the phase; every
    other version of the model it started or was removing goes. The state is written to ``store`` (Ray's GCS,
    store.py) before each method returns, and read back by a registry that starts again."""

    def __init__(self, clock: Callable[[], float] = time.time, store: Any = None) -> None:
        self._clock = clock
        self._store = store if store is not None else MemoryStore()
        doc = self._store.load() or {}
        self._models: dict[str, dict[str, Any]] = {
            model: {**state, "versions": {int(n): e for n, e in state["versions"].items()}}
            for model, state in (doc.get("models") or {}).items()
        }
        self._history: list[dict[str, Any]] = list(doc.get("history") or [])
        self._samples: dict[str, list[dict[str, Any]]] = {}
        self._bundles: dict[str, list[Any]] = {}

    def _doc(self) -> dict[str, Any]:
        models = {m: {**s, "versions": {str(n): e for n, e in s["versions"].items()}} for m, s in self._models.items()}
        return {"models": models, "history": self._history[-HISTORY_KEPT:]}

    def _save(self) -> None:
        self._store.save(self._doc())

    def _held(self, model: str, holder: str) -> dict[str, Any] | None:
        """The rollout of ``model`` when ``holder`` holds its lease, else None."""
        rollout = self._rollout(model)
        return rollout if rollout is not None and rollout.get("holder") == holder else None

    # ---------------------------------------------------------------- taking the lease

    def begin(
        self,
        model: str,
        holder: str,
        running: Mapping[str, str],
        candidate: Mapping[str, Any],
        lease_s: float = LEASE_S,
    ) -> dict[str, Any]:
        """Start a rollout of ``model`` under ``holder``'s lease (``running``: its Serve applications now, {app:
        route}): the candidate's version number, the live one, and ``remove``: the versions an abandoned rollout
        left (its lease expired), which this one removes first (:meth:`drop` each once gone)."""
        taken = self._take(model, running, holder, lease_s)
        if "refused" in taken:
            return taken
        state = self._models[model]
        number = state["next"]
        state["next"] += 1
        state["versions"][number] = {
            **dict(candidate),
            "app": version_app(model, number),
            "route": version_route(model, number),
            "state": "starting",
        }
        state["rollout"].update(version=number, phase=STARTING, count=0, errors=0)
        self._samples[model] = []
        self._save()
        return {"version": number, "live": state["live"], "lease_s": lease_s, **taken}

    def recover(self, model: str, holder: str, running: Mapping[str, str], lease_s: float = LEASE_S) -> dict:
        """`rollout --status`'s convergence: when ``model``'s rollout lease expired (or versions are left to
        remove), take the lease over to remove them (``remove``; :meth:`drop` each, then :meth:`finish`);
        ``remove`` empty and no lease taken when there is nothing to do."""
        taken = self._take(model, running, holder, lease_s, idle=True)
        if "refused" not in taken:
            self._save()
        return taken

    def _take(self, model: str, running: Mapping[str, str], holder: str, lease_s: float, idle: bool = False) -> dict:
        now = self._clock()
        state = self._models.get(model)
        busy = state["rollout"] if state else None
        if busy is not None and busy["holder"] != holder and now < busy["expires"]:
            what = f"v{busy['version']}, {busy['phase']}" if busy["version"] else busy["phase"]
            left = busy["expires"] - now
            return {"refused": f"a rollout of {model} ({what}) holds its lease for {left:.0f} s more; wait for it"}
        if state is not None:  # versions whose application is gone (a restarted server, a candidate whose
            # rollout died before it was deployed) are forgotten, with their packed exports
            gone = [e["app"] for e in state["versions"].values() if e["app"] not in running]
            state["versions"] = {n: e for n, e in state["versions"].items() if e["app"] in running}
            for app in gone:
                self._bundles.pop(app, None)
        if state is None or state["live"] not in state["versions"]:
            fresh = _new_model(model, running)
            fresh["next"] = max(fresh["next"], state["next"] if state else 2)
            state = self._models[model] = fresh
        if not state["versions"]:
            return {"refused": f"no application of model {model!r} runs on this cluster"}
        abandoned = self._abandoned(model, state, busy, now) if busy is not None else None
        remove = sorted(n for n, e in state["versions"].items() if n != state["live"] and e["state"] in LEAVING)
        # a promotion that stepped the live version down in place: what it had is given back
        restore = (
            {"version": state["live"], "replicas": int(busy["live_replicas"])}
            if busy and busy.get("live_replicas")
            else None
        )
        for number in remove:
            state["versions"][number]["state"] = "leaving"
        state["rollout"] = None
        if not idle or remove:
            phase = CONVERGING if idle else STARTING
            state["rollout"] = {"version": None, "from": state["live"], "holder": holder, "phase": phase}
            state["rollout"].update(expires=now + lease_s, lease_s=lease_s, started=now, shadow=None)
        taken = {"remove": remove, "abandoned": abandoned, "live": state["live"]}
        return {**taken, "restore": restore} if restore else taken

    def _abandoned(self, model: str, state: dict[str, Any], busy: Mapping[str, Any], now: float) -> dict | None:
        """The expired rollout ``busy``, ended in the history by what it left: promoted when its candidate is
        live (it died while the old version drained), else rolled back."""
        number = busy.get("version")
        if number is None:  # a clean-up that did not finish: nothing of its own to record
            return None
        verdict = PROMOTED if number == state["live"] else ROLLED_BACK
        reason = f"its process was not heard of for {busy['lease_s']:g} s (it was {busy['phase']})"
        version = dict(state["versions"].get(number) or {}, version=number)
        self._history.append(_entry(model, version, verdict, reason, now))
        return {"version": number, "phase": busy["phase"], "verdict": verdict}

    def renew(self, model: str, holder: str) -> dict[str, Any]:
        """``holder``'s lease runs for its length again from now (refused, fenced, when it is not its own)."""
        rollout = self._held(model, holder)
        if rollout is None:
            return _fenced(model, self._rollout(model))
        rollout["expires"] = self._clock() + rollout["lease_s"]
        self._save()
        return {"expires": rollout["expires"]}

    def phase(self, model: str, holder: str, phase: str) -> dict[str, Any]:
        """The rollout's step now (one of :data:`PHASES`), for whoever finds its lease expired."""
        rollout = self._held(model, holder)
        if rollout is None:
            return _fenced(model, self._rollout(model))
        rollout["phase"] = phase
        self._save()
        return {"phase": phase}

    # ---------------------------------------------------------------- a rollout's steps

    def ready(self, model: str, holder: str, version: int) -> dict[str, Any]:
        """The candidate runs: it is listed among the versions, and reachable at its route."""
        rollout = self._held(model, holder)
        if rollout is None or rollout["version"] != version:
            return _fenced(model, self._rollout(model))
        self._models[model]["versions"][version]["state"] = "candidate"
        rollout["phase"] = CANDIDATE
        self._save()
        return {"phase": CANDIDATE}

    def keep(self, model: str, holder: str, app: str, bundle: Any) -> Any:
        """Put ``bundle`` (a packed export) in Ray's object store, owned here, so that replicas started later (a
        replacement) still find it after the rollout's process exits; ``[ref]`` (a list: Ray passes it on)."""
        import ray

        if self._held(model, holder) is None:
            return _fenced(model, self._rollout(model))
        self._bundles[app] = [ray.put(bundle)]
        return self._bundles[app]

    def start_shadow(self, model: str, holder: str, budget: int, timeout_s: float, seconds: float) -> dict:
        """Copy the next ``budget`` unversioned inferences (for at most ``seconds``) to the candidate; each copy
        is given ``timeout_s`` to be answered."""
        rollout = self._held(model, holder)
        if rollout is None:
            return _fenced(model, self._rollout(model))
        app = self._models[model]["versions"][rollout["version"]]["app"]
        until = self._clock() + seconds
        rollout["shadow"] = {"app": app, "budget": int(budget), "timeout_s": float(timeout_s), "until": until}
        rollout["phase"] = SHADOW
        self._save()
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
            rollout["shadow"] = None  # the budget is spent: the guards stop tagging at their next read
            self._save()

    def progress(self, model: str, holder: str) -> dict[str, Any]:
        """How far the shadow is (``count``, ``errors``, ``shadowing``)."""
        rollout = self._held(model, holder)
        if rollout is None:
            return _fenced(model, self._rollout(model))
        shadow = rollout["shadow"]
        shadowing = shadow is not None and self._clock() < shadow["until"]
        return {"count": rollout["count"], "errors": rollout["errors"], "shadowing": shadowing}

    def samples(self, model: str, holder: str, start: int = 0) -> Any:
        """The shadow copies' outcomes from the ``start``-th on (a rollout reads them as they come)."""
        if self._held(model, holder) is None:
            return _fenced(model, self._rollout(model))
        return list(self._samples.get(model, [])[start:])

    def stop_shadow(self, model: str, holder: str) -> dict[str, Any]:
        rollout = self._held(model, holder)
        if rollout is None:
            return _fenced(model, self._rollout(model))
        rollout["shadow"] = None
        self._save()
        return {}

    def split(self, model: str, holder: str, version: int, share: float, live_replicas: int) -> dict[str, Any]:
        """During a promotion on a full cluster, the part ``share`` of unversioned requests goes to ``version`` (the
        rollout's candidate) from the guards' next read, the rest to the live version (0: none); ``live_replicas``,
        the live version's count before the promotion, is what a takeover gives it back."""
        rollout = self._held(model, holder)
        if rollout is None or rollout["version"] != version:
            return _fenced(model, self._rollout(model))
        entry = self._models[model]["versions"][version]
        share = min(max(float(share), 0.0), 1.0)
        rollout["split"] = {"app": entry["app"], "route": entry["route"], "share": share} if share > 0 else None
        rollout["live_replicas"] = int(live_replicas)
        self._save()
        return {"share": share}

    def promote(self, model: str, holder: str, version: int) -> dict[str, Any]:
        """Unversioned requests go to ``version`` (the rollout's candidate) from the guards' next read; the old
        live one is leaving; the phase is :data:`DRAINING`, in the same step."""
        rollout = self._held(model, holder)
        if rollout is None or rollout["version"] != version:
            return _fenced(model, self._rollout(model))
        state = self._models[model]
        old = state["live"]
        state["versions"][old]["state"] = "leaving"
        state["versions"][version]["state"] = "live"
        state["live"] = version
        rollout["phase"] = DRAINING
        rollout["split"] = None
        self._save()
        return {"live": version, "old": old}

    def drop(self, model: str, holder: str, version: int) -> dict[str, Any]:
        """``version`` is gone (rolled back, drained after a promotion, left by an abandoned rollout): forget it
        and its packed export. The live version is never dropped."""
        if self._held(model, holder) is None:
            return _fenced(model, self._rollout(model))
        state = self._models[model]
        if version == state["live"]:
            return {"refused": f"v{version} of {model} is live: it is never removed"}
        entry = state["versions"].pop(version, None)
        if entry is not None:
            self._bundles.pop(entry["app"], None)
        self._save()
        return {}

    def finish(self, model: str, holder: str, entry: Mapping[str, Any] | None) -> dict[str, Any]:
        """The rollout is over, its lease given back: ``entry`` (version, sha, verdict, reason, figures) joins
        the history (None: a clean-up, nothing to add)."""
        if self._held(model, holder) is None:
            return _fenced(model, self._rollout(model))
        self._models[model]["rollout"] = None
        self._samples.pop(model, None)
        if entry:
            self._history.append({"model": model, **dict(entry)})
        self._save()
        return {}

    def forget(self, model: str) -> None:
        """The model's server stopped: its versions go (the history stays)."""
        state = self._models.pop(model, None)
        for entry in (state or {}).get("versions", {}).values():
            self._bundles.pop(entry["app"], None)
        self._save()

    # ---------------------------------------------------------------- what others read

    def routing(self) -> dict[str, dict[str, Any]]:
        """What the proxy's guard needs, per model (store.py's :func:`routing_table`; the guards
        read it from the stored state, not from here)."""
        return routing_table(self._doc(), self._clock())

    def status(self) -> dict[str, Any]:
        """Every model's versions and rollout in progress (its version, phase, the seconds its lease has left),
        and the history, for `vitdeploy rollout --status`."""
        now = self._clock()
        models = {}
        for model, state in self._models.items():
            rollout = state["rollout"]
            if rollout is not None:
                rollout = {
                    "version": rollout["version"],
                    "phase": rollout["phase"],
                    "lease_s": rollout["expires"] - now,
                }
            versions = {str(n): dict(e) for n, e in sorted(state["versions"].items())}
            models[model] = {"live": state["live"], "versions": versions, "rollout": rollout}
        return {"models": models, "history": list(self._history)}

    def _rollout(self, model: str) -> dict[str, Any] | None:
        state = self._models.get(model)
        return None if state is None else state["rollout"]


def registry_actor(create: bool = False) -> Any:
    """The registry's actor handle on the Ray this process is connected to; None when there is none, ``create``
    is False and no registry ever ran on this cluster (one whose state is stored is started again: it goes on
    from its stored state)."""
    import ray

    try:
        return ray.get_actor(REGISTRY, namespace=NAMESPACE)
    except ValueError:
        if not create and GcsStore().load() is None:
            return None
    actor = ray.remote(num_cpus=0, max_restarts=-1)(RolloutRegistry)
    options = {"name": REGISTRY, "namespace": NAMESPACE, "lifetime": "detached", "get_if_exists": True}
    return actor.options(**options).remote(store=GcsStore())


# ------------------------------------------------------------------------------------------------ who reads it


class RoutingTable:
    """The rollouts' routing (:meth:`RolloutRegistry.routing`), read from the registry's stored state in Ray's GCS
    (store.py: never from the registry itself, so a dead registry changes nothing) at most once per ROUTING_TTL_S,
    one read at a time; while it cannot be read the last table stands, so no request is sent to a version that
    left."""

    def __init__(self, read: Callable[[], Awaitable[dict[str, Any] | None]] | None = None) -> None:
        self._read = read or _read_stored
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
                    log.warning("the rollouts' routing could not be read (%s); routing as before", first_line(exc))
                else:
                    self._table = table if table is not None else {}
                self._at = time.monotonic()
        return self._table


async def _read_stored() -> dict[str, Any] | None:
    """The routing table from the GCS; None when no rollout ever ran on this cluster."""
    return await asyncio.get_running_loop().run_in_executor(None, read_routing, time.time())


#: the one routing table of a proxy process (its HTTP guard: serve/proxy_guard.py; its gRPC: serve/kserve_grpc.py)
ROUTING = RoutingTable()


__all__ = [
    "CANDIDATE",
    "CONVERGING",
    "DRAINING",
    "LEASE_S",
    "NAMESPACE",
    "PHASES",
    "PROMOTED",
    "PROMOTING",
    "REGISTRY",
    "ROLLED_BACK",
    "ROLLING_BACK",
    "ROUTING",
    "SHADOW",
    "STARTING",
    "RolloutRegistry",
    "RoutingTable",
    "registry_actor",
]
