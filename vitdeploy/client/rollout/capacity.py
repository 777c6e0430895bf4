"""Capacity kept through a promotion: the promoted version ends with the live version's replica count (and its
autoscaling settings), grown one replica at a time as the cluster has room.

:func:`scale_steps` is the plan, pure: the candidate (one replica) grows beside the live version while the cluster
has room for another replica. Where it has grown to the live count, unversioned requests move to it, the old
version drains and goes. On a full cluster, when the old version can be scaled in place (a fixed replica count,
deployed with Ray Serve's external scaler on, as `vitdeploy serve` and `vitdeploy rollout` deploy one: ``shrink``),
it is an incremental upgrade, as KubeRay's and a Kubernetes Deployment's with maxUnavailable=1: unversioned requests
are split between both versions by their replica counts (:data:`BOTH`), then, one replica at a time, the old
version gives one up and the new one takes its place, until the new one has the live count; requests then move to
it whole and the old version drains. The replicas answering clients never fall below the live count (the one
the old version gives up finishes its in-flight requests before it stops).
Without ``shrink`` (an autoscaled live version, or one deployed without the external scaler): requests move once
the candidate has grown as far as the room lets it, the old version goes, and the candidate grows to the live count
in the room the old one left; the capacity stays at least the live count minus one when the cluster has room for
``live - 2`` more replicas beside both (:func:`lowest_capacity` says what it is otherwise, and the rollout says so
in a note).

:class:`Scaler` carries a step of the candidate out on Ray: its application deployed again with the same code
version (Ray Serve changes its replica count in place) and waited for within a time limit; a replica Ray cannot
place within it is taken back (the count that runs is kept), never waited for without end. :class:`Promotion` runs
the steps: the candidate grown, the old version stepped down in place, each split recorded in the registry (what the
guards and the gRPC routing read; a takeover gives the old version its replicas back).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, NamedTuple, Optional

OLD, NEW, BOTH = "old", "new", "both"  # which version answers unversioned requests (BOTH: split by replica count)


class ScaleStep(NamedTuple):
    """Replicas of the old (live) version and of the new one, and which of them answers unversioned requests."""

    old: int
    new: int
    serving: str

    @property
    def capacity(self) -> int:
        return {OLD: self.old, NEW: self.new}.get(self.serving, self.old + self.new)

    @property
    def share(self) -> float:
        """The part of unversioned requests the new version answers."""
        return {OLD: 0.0, NEW: 1.0}.get(self.serving, self.new / max(self.old + self.new, 1))


def scale_steps(live: int, room: int, shrink: bool = False) -> list[ScaleStep]:
    """The promotion's steps from ``live`` replicas of the old version and one of the new (``room``: how many more
    replicas the cluster can place now): the new grows while there is room; then, with ``shrink`` (the old version
    can be scaled in place), requests are split and the old gives up a replica for each one the new takes until the
    new has ``live``; requests move, the old goes; the new grows to ``live`` if it has not yet."""
    live, room = max(int(live), 1), max(int(room), 0)
    new = 1
    steps = [ScaleStep(live, new, OLD)]
    while new < live and room > 0:
        new, room = new + 1, room - 1
        steps.append(ScaleStep(live, new, OLD))
    old = live
    if shrink and new < live:
        steps.append(ScaleStep(old, new, BOTH))
        while new < live:
            old -= 1
            steps.append(ScaleStep(old, new, BOTH))
            new += 1
            steps.append(ScaleStep(old, new, BOTH))
    steps += [ScaleStep(old, new, NEW), ScaleStep(0, new, NEW)]  # requests move; then the old version drains and goes
    while new < live:
        new += 1
        steps.append(ScaleStep(0, new, NEW))
    return steps


def lowest_capacity(steps: list[ScaleStep]) -> int:
    """The fewest replicas answering clients at any step."""
    return min(step.capacity for step in steps)


def room_for(free_cpus: float, cpus_per_replica: float) -> int:
    """How many more replicas of ``cpus_per_replica`` CPU fit in ``free_cpus`` (a replica asking none: as many as
    the plan wants, Ray places it anywhere)."""
    if cpus_per_replica <= 0:
        return 1 << 16
    return int(math.floor(max(free_cpus, 0.0) / cpus_per_replica + 1e-9))


def live_autoscaling(details: dict[str, Any], app: str) -> Optional[dict[str, Any]]:
    """The autoscaling_config of application ``app``'s deployment in Ray Serve's details (None: a fixed count)."""
    deployments = (((details.get("applications") or {}).get(app) or {}).get("deployments")) or {}
    for deployment in deployments.values():
        config = (deployment or {}).get("deployment_config") or {}
        if config.get("autoscaling_config"):
            return dict(config["autoscaling_config"])
    return None


def in_place(details: dict[str, Any], app: str) -> bool:
    """Whether application ``app``'s replica count can be changed in place (deployed with Ray Serve's external
    scaler on), by Ray Serve's details."""
    return bool(((details.get("applications") or {}).get(app) or {}).get("external_scaler_enabled"))


class Scaler:
    """The candidate's replica count changed on Ray: ``deploy(replicas, autoscaling)`` deploys its application
    again (same code version: in place), ``running()`` counts its RUNNING replicas."""

    def __init__(
        self, deploy: Callable[[int, Optional[dict[str, Any]]], None], running: Callable[[], int], timeout_s: float
    ) -> None:
        self.deploy, self.running, self.timeout_s = deploy, running, float(timeout_s)

    def to(self, replicas: int, poll_s: float = 0.25) -> bool:
        """``replicas`` running within the time limit: True; else the count that runs is deployed back (no
        replica left pending) and False."""
        self.deploy(replicas, None)
        deadline = time.monotonic() + self.timeout_s
        while self.running() < replicas:
            if time.monotonic() > deadline:
                self.deploy(max(self.running(), 1), None)
                return False
            time.sleep(poll_s)
        return True


class Promotion:
    """A promotion's replica steps carried out (the driver's ``promote``): the candidate grown by ``scaler``, the
    old version stepped down in place, the split recorded under ``lease``; each step said to ``progress``, what
    fell short in ``notes``."""

    def __init__(
        self, lease: Any, model: str, live: int, version: int, scaler: Scaler, progress: Any, notes: list[str]
    ) -> None:
        self.lease, self.model, self.live, self.version = lease, model, live, version
        self.scaler, self.progress, self.notes = scaler, progress, notes
        self.split_at: Optional[float] = None  # when requests began to move (time.time()): the first split

    def grow(self, counts: list[int], running: int) -> int:
        """The candidate grown through ``counts``, one replica at a time, until Ray cannot place the next one
        within the start timeout; the count it runs."""
        for count in counts:
            self.progress(f"scaling v{self.version} to {count} replica(s) ...")
            if not self.scaler.to(count):
                break
            running = count
        return running

    def step_down(self, steps: list[ScaleStep], running: int, live: int) -> int:
        """A full cluster's incremental upgrade (the :data:`BOTH` steps): unversioned requests split between the
        versions by their replica counts, the old version giving up one replica for each one the candidate takes
        (in place: the replicas that stay never restart); the count the candidate runs."""
        from ...serve.rollout.candidate import scale_version
        from ...serve.rollout.routes import ROUTING_TTL_S, version_app

        old_app, old = version_app(self.model, self.live), live
        for step in steps:
            if step.old < old:
                self.progress(f"v{self.live} gives up a replica for v{self.version}: {step.old} left ...")
                refused = scale_version(old_app, step.old)
                if refused:
                    self.notes.append(f"v{self.live} could not be scaled down in place: {refused}")
                    break
                old = step.old
            elif step.new > running:
                self.progress(f"scaling v{self.version} to {step.new} replica(s) ...")
                if not self.scaler.to(step.new):
                    break
                running = step.new
            self.lease.call("split", self.version, running / (old + running), live)
            if step is steps[0]:
                self.split_at = (
                    time.time()
                )  # every guard splits requests before the old version gives up its first replica
                self.progress(
                    f"splitting unversioned requests between v{self.live} and v{self.version} by their replica "
                    f"counts (no room for v{self.version} at {live} beside v{self.live}) ..."
                )
                time.sleep(2 * ROUTING_TTL_S + 0.5)
        return running

    def capacity_notes(self, live: int, moved: int, grown: int, autoscaling: Optional[dict[str, Any]]) -> None:
        if moved < live - 1:
            self.notes.append(
                f"requests moved to v{self.version} with {moved} replica(s), v{self.live} had {live}: the cluster had "
                f"room for no more beside v{self.live}"
            )
        if grown < live:
            self.notes.append(f"v{self.version} serves with {grown} replica(s) (v{self.live} had {live}): add room")
        if autoscaling:
            self.notes.append(
                f"v{self.version} autoscales as v{self.live} did ({autoscaling.get('min_replicas')}-"
                f"{autoscaling.get('max_replicas')} replicas)"
            )


__all__ = [
    "BOTH",
    "NEW",
    "OLD",
    "Promotion",
    "Scaler",
    "ScaleStep",
    "in_place",
    "live_autoscaling",
    "lowest_capacity",
    "room_for",
    "scale_steps",
]
