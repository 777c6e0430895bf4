"""Capacity kept through a promotion: the promoted version ends with the live version's replica count (and its
autoscaling settings), grown one replica at a time as the cluster has room.

:func:`scale_steps` is the plan, pure: the candidate (one replica) grows beside the live version while the cluster
has room for another replica, unversioned requests move to it, the old version drains and goes, and the candidate
grows to the live count in the room the old one left. The capacity answering clients at each step is the old
version's replicas before the move and the candidate's after; it stays at least the live count minus one when the
cluster has room for ``live - 2`` more replicas beside both (:func:`lowest_capacity` says what it is otherwise,
and the rollout says so in a note). The old version is not scaled down before it drains: `vitdeploy serve`
deploys it without a code version of ours, so any change of its replica count would replace its replicas.

:class:`Scaler` carries a step out on Ray: the candidate's application deployed again with the same code version
(Ray Serve changes its replica count in place) and waited for within a time limit; a replica Ray cannot place
within it is taken back (the count that runs is kept), never waited for without end.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, NamedTuple, Optional

OLD, NEW = "old", "new"


class ScaleStep(NamedTuple):
    """Replicas of the old (live) version and of the new one, and which of them answers unversioned requests."""

    old: int
    new: int
    serving: str

    @property
    def capacity(self) -> int:
        return self.old if self.serving == OLD else self.new


def scale_steps(live: int, room: int) -> list[ScaleStep]:
    """The promotion's steps from ``live`` replicas of the old version and one of the new (``room``: how many more
    replicas the cluster can place now): the new grows while there is room, requests move, the old goes, the new
    grows to ``live``."""
    live, room = max(int(live), 1), max(int(room), 0)
    new = 1
    steps = [ScaleStep(live, new, OLD)]
    while new < live and room > 0:
        new, room = new + 1, room - 1
        steps.append(ScaleStep(live, new, OLD))
    steps += [ScaleStep(live, new, NEW), ScaleStep(0, new, NEW)]  # requests move; then the old version drains and goes
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


__all__ = ["NEW", "OLD", "Scaler", "ScaleStep", "live_autoscaling", "lowest_capacity", "room_for", "scale_steps"]
