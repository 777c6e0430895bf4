"""`vitdeploy rollout`'s hands on Ray Serve: a version started beside the live one and removed, each within a
bounded time, and the CPU a candidate may take.

Ray Serve waits for a replica it cannot place for as long as it takes (a rolling replacement on a full machine
waits forever); these functions never do: a candidate that is not RUNNING when its time is up is a failed start,
with the reason Ray gives (its deployment's message: the resources it waits for, the replica's error).
Imports Ray when called; the process must be connected to the server's Ray (``ray.init(address=...)``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Mapping

from ...base.errors import BackendError, remote_reason
from ...base.ray_private import delete_nowait, run_nowait, scale_in_place
from .routes import version_of_app, version_route

log = logging.getLogger(__name__)

POLL_S = 0.25
FREE_WAIT_S = 10.0  # how long a candidate waits for the CPU a removal frees, before it cannot be placed
DECLARATIVE = "declarative"  # the source Ray Serve gives an application applied from a config
LOGGING = {"log_level": "WARNING", "enable_access_log": False}


def running_versions(model: str) -> dict[str, str]:
    """``model``'s Serve applications on this cluster, ``{application: route prefix}`` (by their names)."""
    from ray import serve

    out = {}
    for app in serve.status().applications:
        number = version_of_app(model, app)
        if number is not None:
            out[app] = version_route(model, number)
    return out


def declarative_refusal(model: str, sources: Mapping[str, str]) -> str | None:
    """The one line refusing a rollout of ``model`` when one of its applications came from a Serve config
    (``sources``: each application's origin, base/ray_private.py's serve_app_sources: ``declarative`` for
    `serve deploy` and a RayService), whose next apply would put the old export back; None otherwise."""
    apps = sorted(a for a, origin in sources.items() if origin == DECLARATIVE and version_of_app(model, a) is not None)
    if not apps:
        return None
    return (
        f"model {model!r} runs from a Serve config (application {apps[0]!r} was applied by `serve deploy` or a "
        "RayService), which would put the old export back: roll it out declaratively instead: name the new export "
        "in the config (the application's args.artifacts, as `vitdeploy serve -a NEW_EXPORT --write-config` or "
        "--write-rayservice writes it) and apply it again (`serve deploy serve.yaml`, `kubectl apply -f` the "
        "RayService); Ray Serve replaces the replicas itself"
    )


def replica_count(app: str) -> int:
    """How many replicas of ``app`` are RUNNING (0 when it is not there)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return 0
    return sum(int(d.replica_states.get("RUNNING", 0)) for d in status.deployments.values())


def free_cpus(at_least: float = 0.0, wait_s: float = FREE_WAIT_S) -> float:
    """The CPUs no actor holds on the cluster now (Ray's available resources); with ``at_least``, that many waited
    for, at most ``wait_s``: Ray's view lags a version just removed (what an abandoned rollout left) by a moment.
    The last read when they do not come."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        free = float(ray.available_resources().get("CPU", 0.0))
        if free + 1e-9 >= at_least or time.monotonic() > deadline:
            return free
        time.sleep(POLL_S)


def candidate_cpus(asked: float, free: float) -> tuple[float, str | None]:
    """The CPUs one candidate replica takes: ``asked`` (serve.num_cpus_per_replica) when that much is free, else
    what is free (whole tenths) when that is at least one CPU (or all it asked, if it asked less); with the
    sentence that says so, None when it got what it asked. BackendError when less is free: it cannot be placed
    (the rollout rolls it back at once rather than start a replica with no core of its own)."""
    if free + 1e-9 >= asked:
        return asked, None
    need = min(asked, 1.0)
    share = math.floor(max(free, 0.0) * 10 + 1e-9) / 10
    if share + 1e-9 < need:
        raise BackendError(
            f"it cannot be placed: {max(free, 0.0):g} CPU is free beside the live replicas, and a replica needs at "
            f"least {need:g} ({asked:g} asked; free a CPU, or add a node)"
        )
    return share, f"{share:g} CPU is what is free beside the live replicas ({asked:g} asked)"


def start_version(application: Any, app: str, route: str, timeout_s: float) -> None:
    """Deploy ``application`` (a bound Serve application of a fixed replica count) as ``app`` at ``route`` beside
    what runs, its count changeable in place (:func:`scale_version`), and wait until it is RUNNING, at most
    ``timeout_s``; BackendError with Ray's reason when it failed or did not start in time (the caller removes it)."""
    from ray import serve

    try:
        run_nowait(application, app, route, LOGGING, external_scaler=True)
    except Exception as exc:  # noqa: BLE001 - Ray wraps the controller's refusal in its own types
        raise BackendError(f"Ray Serve refused to deploy it: {remote_reason(exc)}") from exc
    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status().applications.get(app)
        state = str(getattr(status, "status", ""))
        if state.endswith("RUNNING"):
            return
        if state.endswith(("DEPLOY_FAILED", "UNHEALTHY")):
            raise BackendError(f"it failed to start: {remote_reason(_message(status))}")
        if time.monotonic() > deadline:
            waiting = _message(status)
            why = f": {remote_reason(waiting)}" if waiting else ""
            raise BackendError(f"it did not start within {timeout_s:g} s{why}")
        time.sleep(POLL_S)


def scale_version(app: str, replicas: int) -> str | None:
    """Set ``app``'s replica count to ``replicas`` in place: its running replicas stay, one it gives up finishes
    its in-flight requests first (``app`` deployed with Ray Serve's external scaler on, as `vitdeploy serve` and
    :func:`start_version` deploy a fixed count). None once Ray took it, else why not (Ray's reason)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return f"{app} is not running"
    try:
        scale_in_place(app, list(status.deployments), replicas)
    except Exception as exc:  # noqa: BLE001 - Ray's refusal (no external scaler, the app going): said, not raised
        return remote_reason(exc)
    return None


def remove_version(app: str, timeout_s: float) -> bool:
    """Delete ``app`` (its replicas finish their in-flight requests first, within the deployment's
    graceful_shutdown_timeout_s) and wait until it is gone, at most ``timeout_s``; False when it is still there."""
    from ray import serve

    try:
        delete_nowait(app)
    except Exception as exc:  # noqa: BLE001 - the controller's own error: reported, the wait below decides
        log.warning("deleting %s: %s", app, exc)
    deadline = time.monotonic() + timeout_s
    while app in serve.status().applications:
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def _message(status: Any) -> str:
    """The application's message, else its deployments' (where Ray says what a replica waits for, or its error)."""
    if status is None:
        return ""
    texts = [str(status.message or "")] + [str(d.message or "") for d in status.deployments.values()]
    return "\n".join(t for t in texts if t.strip())


__all__ = [
    "candidate_cpus",
    "declarative_refusal",
    "free_cpus",
    "remove_version",
    "replica_count",
    "running_versions",
    "scale_version",
    "start_version",
]
