"""What a `vitdeploy rollout` process does with the rollout registry (serve/rollout/registry.py): it joins the
server's Ray, holds its model's lease, renews it from a background thread during every phase, and removes what an
abandoned rollout left (:func:`converge_all`: what `rollout --status` does first).

    lease = Lease(ray, "vit-demo")
    began = lease.call("begin", running, candidate, lease.lease_s)   # refused while another holds it
    lease.hold()                                                       # renewed every lease_s / 4 from now on
    ...
    lease.call("promote", 2)      # refused, and lease.lost said, once another process took the lease over
    lease.release()

A rollout whose process stops (Ctrl-C, SIGKILL, a machine gone) stops renewing; once its lease expired the next
rollout, or `vitdeploy rollout --status` (status.py), takes it over and removes what it left by its recorded phase:
every version of the model but the live one (a candidate that never went live; after a promotion, the old version
that was draining). The live version is never removed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any, Callable, Optional

from ...base._deps import require
from ...base.errors import BackendError, first_line
from ...base.ray_join import find_local_cluster, init_ray
from ...serve.rollout.registry import LEASE_S, registry_actor
from ...serve.rollout.routes import version_app

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
RETRIES = 5  # calls to a registry that died, while Ray starts it again (it reads its state back from the GCS)
RETRY_S = 1.0
STATUS_REMOVE_S = 90.0  # `rollout --status`: how long a version left by an abandoned rollout may take to go


def connect(address: Optional[str], progress: Optional[Progress] = None) -> Any:
    """This process on the server's Ray (already connected: as it is): ``address`` (``--address``), else
    ``RAY_ADDRESS``, else the cluster running on this machine, as Ray's own tools find it (address "auto"), named
    to ``progress``; joined through init_ray either way (Ray's token, a loopback cluster looked for there)."""
    ray = require("ray", "vitdeploy rollout (pip install 'vitdeploy[serve]')")
    require("ray.serve", "vitdeploy rollout (pip install 'vitdeploy[serve]')")
    if not log.isEnabledFor(logging.INFO):  # Ray Serve's own INFO lines repeat what progress() says
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    found = not address
    if found:
        address = find_local_cluster()  # ConfigError in one line: none here, or several
    try:
        init_ray(ray, address, logging_level=logging.WARNING, log_to_driver=False)  # the server shows them
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BackendError(f"cannot join the Ray cluster at {address}: {first_line(exc)}; check --address") from None
    if found and progress is not None:
        progress(f"joined the Ray cluster at {address}, found on this machine (no --address or RAY_ADDRESS given)")
    return ray


class Lease:
    """A rollout process's lease on ``model`` in the registry: ``holder`` (this process's id) names it in every
    call that changes the rollout's state; :meth:`hold` renews it in the background until :meth:`release`.
    ``lost``: why it is no longer this process's (another process took it over), None while it is."""

    def __init__(self, ray: Any, model: str, lease_s: float = LEASE_S) -> None:
        self.ray, self.model, self.lease_s = ray, model, float(lease_s)
        self.holder = uuid.uuid4().hex
        self.registry = registry_actor(create=True)
        self.lost: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def call(self, method: str, *args: Any) -> Any:
        """``method(model, holder, *args)`` on the registry, its answer; a refusal is a BackendError (and, when
        the lease is another's now, :attr:`lost`)."""
        if self.lost:
            raise BackendError(self.lost)
        answer = self.read(method, self.model, self.holder, *args)
        if isinstance(answer, dict) and answer.get("refused"):
            if answer.get("fenced"):
                self.lost = str(answer["refused"])
            raise BackendError(str(answer["refused"]))
        return answer

    def read(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the registry; a registry that died is looked up (started again) and asked once
        more, a few times while Ray restarts it."""
        from ray.exceptions import RayActorError

        for attempt in range(RETRIES):
            try:
                return self.ray.get(getattr(self.registry, method).remote(*args))
            except RayActorError as exc:
                if attempt == RETRIES - 1:
                    raise BackendError(f"the rollout registry does not answer: {first_line(exc)}") from None
                log.warning("the rollout registry died (%s); asking it again", first_line(exc))
                time.sleep(RETRY_S)
                self.registry = registry_actor(create=True)
        raise AssertionError("unreachable")

    def hold(self) -> None:
        """Renew the lease every ``lease_s / 4`` from a daemon thread until :meth:`release` (or it is lost)."""
        self._thread = threading.Thread(target=self._renew, name="vitdeploy-rollout-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            try:
                self.call("renew")
            except BackendError as exc:
                if self.lost:
                    log.warning("%s", self.lost)
                    return
                log.warning("the rollout's lease was not renewed: %s", first_line(exc))
            except Exception as exc:  # noqa: BLE001 - Ray's errors: the next renewal may get through
                log.warning("the rollout's lease was not renewed: %s", first_line(exc))


def converge(
    lease: Lease, remove: list[int], remove_s: float, progress: Progress, why: str, restore: Optional[dict] = None
) -> list[str]:
    """Remove the versions ``remove`` (what an abandoned rollout left, never the live one) under ``lease``, each
    dropped from the registry once gone, then give the live version back the replicas an abandoned promotion
    stepped it down from (``restore``: its version and count); notes on a version still stopping."""
    from ...serve.rollout.candidate import remove_version, replica_count, scale_version

    notes = []
    for number in remove:
        progress(f"removing v{number}, {why}")
        if not remove_version(version_app(lease.model, number), remove_s):
            notes.append(f"v{number} was still stopping after {remove_s:g} s")
            continue
        lease.call("drop", number)
    if restore:
        app, count = version_app(lease.model, restore["version"]), int(restore["replicas"])
        if replica_count(app) < count:
            progress(f"giving v{restore['version']} back its {count} replica(s), {why}")
            refused = scale_version(app, count)
            if refused:
                notes.append(f"v{restore['version']} was not given back its {count} replica(s): {refused}")
    return notes


def leave(lease: Lease, version: int, remove_s: float, progress: Progress) -> None:
    """``lease`` was taken over (its process was not heard of for a lease's length): the process that took it
    removes what this one left; only a candidate ``version`` this one started after that, unknown to the
    registry, is removed here (never a version the registry lists: never the live one)."""
    from ray import serve

    from ...serve.rollout.candidate import remove_version

    known = lease.read("status")["models"].get(lease.model, {}).get("versions", {})
    app = version_app(lease.model, version)
    if version and str(version) not in known and app in serve.status().applications:
        progress(f"this rollout lost its lease: removing v{version}, which it started")
        remove_version(app, remove_s)


def abandoned_line(abandoned: Optional[dict[str, Any]]) -> str:
    """Why versions are to be removed, for the progress line."""
    if not abandoned:
        return "left by a rollout that did not finish"
    version, phase, verdict = abandoned["version"], abandoned["phase"], abandoned["verdict"]
    return f"left by the rollout of v{version}, abandoned while {phase} ({verdict})"


def converge_all(ray: Any, registry: Any) -> list[str]:
    """`rollout --status` first converges: every model whose rollout lease expired (or that has versions left to
    remove) gets them removed now, under a lease of its own; what was done, as lines."""
    from ...serve.rollout.candidate import running_versions

    done: list[str] = []
    status = ray.get(registry.status.remote())
    for model, state in sorted(status.get("models", {}).items()):
        rollout = state.get("rollout")
        leaving = any(e["state"] in ("leaving", "starting", "candidate") for e in state["versions"].values())
        if (rollout is not None and rollout["lease_s"] > 0) or (rollout is None and not leaving):
            continue
        lease = Lease(ray, model)
        try:
            taken = lease.call("recover", running_versions(model), lease.lease_s)
        except BackendError as exc:
            done.append(f"{model}: {first_line(exc)}")
            continue
        if not taken["remove"]:
            continue
        lease.hold()
        try:
            why = abandoned_line(taken.get("abandoned"))
            notes = converge(
                lease,
                taken["remove"],
                STATUS_REMOVE_S,
                lambda line: done.append(f"{model}: {line}"),
                why,
                taken.get("restore"),
            )
            done += [f"{model}: {note}" for note in notes]
            lease.call("finish", None)
        finally:
            lease.release()
    return done


__all__ = ["Lease", "abandoned_line", "connect", "converge", "converge_all", "leave"]
