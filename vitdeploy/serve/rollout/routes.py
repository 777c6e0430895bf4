"""Versions of one model side by side on one Ray Serve: where each lives, and what the proxy's guard tells the
replicas about them.

Version 1 of a model is the application `vitdeploy serve` deployed (named after the model, route
``/v2/models/<name>``); version K > 1, started by `vitdeploy rollout`, is the application ``<name>@vK`` at
``/v2/models/<name>/versions/K``, so Ray's proxy (the longest route prefix wins) sends a versioned request
straight to it. The guard rewrites an unversioned path to the live version's route (:func:`routed`, from the
rollout registry's routing: registry.py) and tells the replicas per request, in headers, which versions exist
(:data:`VERSIONS_HEADER`) and where a copy of the request goes (:data:`SHADOW_HEADER`), so a replica never polls
anything. Headers a client sends under :data:`HEADER_PREFIX` are dropped by the guard.

Pure: no Ray, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...base.errors import NotFoundError

#: how long the guard keeps the registry's routing table; a promotion waits this long, twice, before the old
#: version stops, so no request is routed to it afterwards
ROUTING_TTL_S = 1.0
HEADER_PREFIX = "x-vitdeploy-"
VERSIONS_HEADER = HEADER_PREFIX + "versions"  # "1,2": the versions of the model, for its metadata
SHADOW_HEADER = HEADER_PREFIX + "shadow"  # "<candidate app> <timeout s>": copy this request there
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


def routed(
    path: str, method: str, model: str, entry: Mapping[str, Any] | None, draw: float = 1.0
) -> tuple[str, list[tuple[str, str]]]:
    """Where the guard sends ``path`` (a route of ``model``) and the headers it adds, from the model's
    :meth:`RolloutRegistry.routing` entry (None: the model has one version, nothing changes).

    An unversioned path goes to the live version's route and, for an inference while a shadow runs, is tagged
    for a copy; during a promotion that splits requests (the entry's ``split``), to the promoted version's route
    when ``draw`` (uniform in [0, 1)) falls below its share. A versioned path is left to Ray's proxy (the
    version's own route) unless the version is not there: NotFoundError (404) naming the versions there are."""
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
    return str(split_target(entry, draw, "route") or entry["live"]) + rest, headers


def split_target(entry: Mapping[str, Any], draw: float, key: str) -> Any:
    """The promoted version's ``key`` (its route, its app) for a request drawn ``draw`` while the entry splits
    unversioned requests and the draw falls within its share; None: the live version answers it."""
    split = entry.get("split")
    return split[key] if split and draw < float(split["share"]) else None


__all__ = [
    "HEADER_PREFIX",
    "ROUTING_TTL_S",
    "SHADOW_HEADER",
    "VERSIONS_HEADER",
    "Shadow",
    "parse_shadow",
    "parse_versions",
    "routed",
    "split_target",
    "version_app",
    "version_of_app",
    "version_route",
]
