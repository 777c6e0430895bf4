"""Versions of one model side by side on one Ray Serve: where each lives, which one is live, the rollout registry.

Version 1 of a model is the application `vitdeploy serve` deployed (named after the model, route
``/v2/models/<name>``); version K > 1, started by `vitdeploy rollout`, is the application ``<name>@vK`` at
``/v2/models/<name>/versions/K``, so Ray's proxy (the longest route prefix wins) sends a versioned request
straight to it. Which version answers unversioned requests, which versions exist and where shadow copies go is
the registry's: :class:`RolloutRegistry`, one named detached Ray actor (:data:`REGISTRY` in namespace
:data:`NAMESPACE`, no CPU) that `vitdeploy rollout` creates; it also keeps each rollout's history and the
candidates' packed exports (it owns them in Ray's object store, so they outlive the rollout's process).

The proxy's guard reads the registry's :meth:`~RolloutRegistry.routing` (cached :data:`ROUTING_TTL_S`; a cluster
where no rollout ran has no registry) and :func:`routed` rewrites an unversioned path to the live version's route; it
tells the replicas per request, in headers, which versions exist (:data:`VERSIONS_HEADER`) and where a copy
of the request goes (:data:`SHADOW_HEADER`), so a replica never polls anything. Headers a client sends under
:data:`HEADER_PREFIX` are dropped by the guard.

No Ray at import: the registry is a plain class (Ray makes an actor of it in :func:`registry_actor`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..base.errors import NotFoundError

NAMESPACE = "vitdeploy"
REGISTRY = "vitdeploy-rollout"
#: how long the guard keeps the registry's routing table; a promotion waits this long, twice, before the old
#: version stops, so no request is routed to it afterwards
ROUTING_TTL_S = 1.0
HEADER_PREFIX = "x-vitdeploy-"
VERSIONS_HEADER = HEADER_PREFIX + "versions"  # "1,2": the versions of the model, for its metadata
SHADOW_HEADER = HEADER_PREFIX + "shadow"  # "<candidate app> <timeout s>": copy this request there
#: a rollout whose process has not been heard of for this long is abandoned: the next one removes its candidate
ABANDONED_S = 30.0
MODELS = "/v2/models/"
VERSIONS = "/versions/"


def version_app(model: str, version: int) -> str:
    """The Serve application of ``model``'s ``version``: the model's own name for version 1, ``<name>@vK`` after."""
    return model if int(version) == 1 else f"{model}@v{int(version)}"


def version_route(model: str, version: int) -> str:
    """The route prefix of ``model``'s ``version``: ``/v2/models/<name>`` for 1, ``.../versions/K`` after."""
    base = f"{MODELS}{model}"
    return base if int(version) == 1 else f"{base}{VERSIONS}{int(version)}"


def version_of_app(model: str, app: str) -> int | None:
    """The version number whose application is ``app`` (:func:`version_app`'s inverse), None for another model's."""
    if app == model:
        return 1
    head, sep, tail = app.rpartition("@v")
    return int(tail) if sep and head == model and tail.isdigit() and int(tail) > 1 else None


# ------------------------------------------------------------------------------------------------ routing


@dataclass(frozen=True)
class Shadow:
    """Where a replica sends a copy of the request it answered (the :data:`SHADOW_HEADER`'s value)."""

    app: str
    version: int
    timeout_s: float

    def header(self) -> str:
        return f"{self.app} {self.timeout_s:g}"


def parse_shadow(value: str | bytes | None, model: str) -> Shadow | None:
    """The :data:`SHADOW_HEADER` value, when it names a version of ``model`` (anything else: None, no copy)."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    app, _, timeout = (value or "").strip().partition(" ")
    version = version_of_app(model, app)
    try:
        seconds = float(timeout)
    except ValueError:
        return None
    return Shadow(app, version, seconds) if version is not None and version > 1 and seconds > 0 else None


def parse_versions(value: str | bytes | None, own: str) -> list[str]:
    """The :data:`VERSIONS_HEADER` value as a sorted list of version strings (``[own]`` without one)."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    found = {v.strip() for v in (value or "").split(",") if v.strip().isdigit()}
    return sorted(found or {own}, key=int)


def routed(path: str, method: str, model: str, entry: Mapping[str, Any] | None) -> tuple[str, list[tuple[str, str]]]:
    """Where the guard sends ``path`` (a route of ``model``) and the headers it adds, from the model's
    :meth:`RolloutRegistry.routing` entry (None: the model has one version, nothing changes).

    An unversioned path goes to the live version's route and, for an inference while a shadow runs, is tagged
    for a copy; a versioned path is left to Ray's proxy (the version's own route) unless the version is not
    there: NotFoundError (404) naming the versions there are."""
    if not entry:
        return path, []
    base = f"{MODELS}{model}"
    rest = path[len(base) :]
    versions = [str(v) for v in entry["versions"]]
    headers = [(VERSIONS_HEADER, ",".join(versions))]
    if rest.startswith(VERSIONS):
        asked = rest[len(VERSIONS) :].split("/", 1)[0]
        if asked not in versions:
            raise NotFoundError(f"model {model!r} has no version {asked!r} (versions: {', '.join(versions)})")
        return path, headers
    shadow = entry.get("shadow")
    if shadow and method == "POST" and rest in ("/infer", "/predict"):
        headers.append((SHADOW_HEADER, Shadow(shadow["app"], 0, float(shadow["timeout_s"])).header()))
    return str(entry["live"]) + rest, headers


# ------------------------------------------------------------------------------------------------ the registry


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


__all__ = [
    "ABANDONED_S",
    "HEADER_PREFIX",
    "NAMESPACE",
    "REGISTRY",
    "ROUTING_TTL_S",
    "SHADOW_HEADER",
    "VERSIONS_HEADER",
    "RolloutRegistry",
    "Shadow",
    "parse_shadow",
    "parse_versions",
    "registry_actor",
    "routed",
    "version_app",
    "version_of_app",
    "version_route",
]
