"""Capacity kept through a promotion (vitdeploy/client/rollout/capacity.py): the promoted version grows to the live
version's replica count one replica at a time, requests move once it has grown as far as the cluster lets it, and
the replicas answering clients never fall below the live count minus one where the cluster has that room; on a full
cluster the old version steps down in place as the new one grows, requests split between them, and the live count
answers all along; a replica Ray cannot place is taken back within the start timeout, never waited for. The
promotion itself on Ray: tests/client/test_rollout_driver.py, on a full Ray: test_rollout_full_cluster.py."""

from __future__ import annotations

import pytest

from vitdeploy.client.rollout.capacity import (
    BOTH,
    NEW,
    OLD,
    Scaler,
    ScaleStep,
    live_autoscaling,
    lowest_capacity,
    room_for,
    scale_steps,
)


@pytest.mark.parametrize("live", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("room", [0, 1, 2, 3, 6, 10])
def test_the_steps_end_at_the_live_count_one_replica_at_a_time_and_keep_capacity_where_there_is_room(live, room):
    steps = scale_steps(live, room)
    assert steps[0] == ScaleStep(live, 1, OLD) and steps[-1] == ScaleStep(0, live, NEW)
    for before, after in zip(steps, steps[1:]):
        assert after.new - before.new in (0, 1)  # grown one replica at a time, never shrunk
        assert after.old in (before.old, 0)  # the old version goes once requests left it
        assert not (after.serving == OLD and before.serving == NEW)  # requests move once
        assert after.old == before.old or after.serving == NEW  # it drains only after the move
    assert sum(1 for s in steps if s.serving == OLD and s.new > 1) <= room  # never more than the room beside it
    if room >= live - 2:
        assert lowest_capacity(steps) >= live - 1  # the live capacity minus one replica at most
    assert lowest_capacity(steps) == min(live, 1 + room)  # otherwise what it is, for the note


def test_on_a_cluster_with_room_requests_move_to_a_version_as_large_as_the_live_one():
    assert scale_steps(3, 5) == [
        ScaleStep(3, 1, OLD),
        ScaleStep(3, 2, OLD),
        ScaleStep(3, 3, OLD),
        ScaleStep(3, 3, NEW),
        ScaleStep(0, 3, NEW),
    ]
    assert scale_steps(3, 1)[-3:] == [
        ScaleStep(3, 2, NEW),
        ScaleStep(0, 2, NEW),
        ScaleStep(0, 3, NEW),
    ]  # a full cluster


def test_room_counts_whole_replicas_of_the_candidates_cpus():
    assert room_for(3.0, 1.0) == 3 and room_for(2.9, 1.0) == 2 and room_for(1.0, 0.5) == 2
    assert room_for(0.0, 1.0) == 0 and room_for(-1.0, 1.0) == 0 and room_for(0.0, 0.0) > 100


def test_the_live_versions_autoscaling_is_read_from_serves_details():
    auto = {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 8.0}
    details = {
        "applications": {
            "vit": {"deployments": {"ViTClassifier": {"deployment_config": {"autoscaling_config": auto}}}},
            "vit@v2": {"deployments": {"ViTClassifier": {"deployment_config": {"num_replicas": 1}}}},
        }
    }
    assert live_autoscaling(details, "vit") == auto
    assert live_autoscaling(details, "vit@v2") is None and live_autoscaling({}, "vit") is None


def test_a_replica_ray_cannot_place_is_taken_back_within_the_time_limit():
    deployed: list[int] = []
    placeable = 2

    def deploy(replicas, autoscaling):
        deployed.append(replicas)

    scaler = Scaler(deploy, lambda: min(deployed[-1], placeable), timeout_s=0.2)
    assert scaler.to(2) and deployed == [2]
    assert not scaler.to(3)  # Ray cannot place the third: back to the two that run
    assert deployed == [2, 3, 2]


class _Lease:
    def __init__(self, events):
        self.events = events

    def call(self, method, *args):
        self.events.append((method, *args))


@pytest.mark.parametrize(
    "live, free, placeable, autoscaling, expected",
    [
        # room for two more: grown to 3 beside the old version, then requests move, then the old goes
        (3, 2.0, 9, None, [("deploy", 2), ("deploy", 3), ("promote", 2), ("remove", "m"), ("drop", 1)]),
        # a full cluster (room for one more): 2 answer after the move, 3 once the old one left room
        (3, 1.0, 9, None, [("deploy", 2), ("promote", 2), ("remove", "m"), ("drop", 1), ("deploy", 3)]),
        # Ray could place fewer than the free CPUs said: the one it cannot is taken back, said in a note
        (3, 2.0, 2, None, [("deploy", 2), ("deploy", 3), ("deploy", 2), ("promote", 2), ("remove", "m")]),
        # the live version autoscaled: the promoted one takes its settings once grown
        (2, 1.0, 9, {"min_replicas": 1, "max_replicas": 5, "target_ongoing_requests": 4.0}, [("deploy", 2)]),
    ],
)
def test_the_promotion_grows_the_candidate_before_the_move_and_after_the_old_version_left(
    monkeypatch, live, free, placeable, autoscaling, expected
):
    """The driver's promotion on fakes of Ray: the order of what it deploys, moves and removes."""
    from vitdeploy.client.rollout import driver
    from vitdeploy.serve.rollout import candidate

    events: list = []
    state = {"new": 1, "placed": 1}
    monkeypatch.setattr(driver.time, "sleep", lambda s: None)
    monkeypatch.setattr(candidate, "free_cpus", lambda: free)
    monkeypatch.setattr(candidate, "replica_count", lambda app: live if app == "m" else state["placed"])

    def remove_version(app, timeout_s):
        events.append(("remove", app))
        return True

    monkeypatch.setattr(candidate, "remove_version", remove_version)
    details = {
        "applications": {"m": {"deployments": {"d": {"deployment_config": {"autoscaling_config": autoscaling}}}}}
    }
    monkeypatch.setattr("vitdeploy.base.ray_private.serve_details", lambda: details)

    rollout = driver._Rollout.__new__(driver._Rollout)
    rollout.model, rollout.version, rollout.live, rollout.notes = "m", 2, 1, []
    rollout.deployed = (None, None, "m@v2", "/v2/models/m/versions/2", 1.0)
    rollout.plan = driver.RolloutPlan("http://x", "e", start_timeout_s=0.05)
    rollout.cfg = type("Cfg", (), {"serve": type("Sv", (), {"graceful_shutdown_timeout_s": 1})()})()
    rollout.lease, rollout.progress = _Lease(events), lambda line: None

    def deploy(replicas, auto):
        events.append(("deploy", replicas) if not auto else ("autoscale", auto["max_replicas"]))
        state["placed"] = min(replicas, placeable)

    monkeypatch.setattr(rollout, "_deploy", deploy)
    rollout.promote()
    moves = [e for e in events if e[0] != "phase"]
    assert moves[: len(expected)] == expected, moves
    if autoscaling:
        assert moves[-1] == ("autoscale", 5) and any("autoscales as v1 did (1-5" in n for n in rollout.notes)
    if placeable < live:
        assert any("serves with 2 replica(s) (v1 had 3)" in n for n in rollout.notes), rollout.notes
    elif not autoscaling:
        assert state["placed"] == live and not rollout.notes


@pytest.mark.parametrize("live", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("room", [0, 1, 2, 7])
def test_on_a_full_cluster_the_old_version_steps_down_as_the_new_one_grows_and_capacity_never_falls(live, room):
    steps = scale_steps(live, room, shrink=True)
    assert steps[0] == ScaleStep(live, 1, OLD) and steps[-1] == ScaleStep(0, live, NEW)
    assert lowest_capacity(steps) >= live  # split by replica counts: the live count answers all along
    for before, after in zip(steps, steps[1:]):
        assert (before.old - after.old, after.new - before.new) in ((0, 0), (0, 1), (1, 0)) or after.old == 0
        assert before.old + before.new <= live + 1 + room and after.old + after.new <= live + 1 + room  # it fits
        assert not (after.serving == OLD and before.serving != OLD)  # requests only ever move forward
    split = [s for s in steps if s.serving == BOTH]
    assert bool(split) == (1 + room < live)  # split only where the cluster has no room for both at full size
    assert all(0 < s.share < 1 for s in split) and split == sorted(split, key=lambda s: s.share)


@pytest.mark.parametrize("shrink", [True, False])
def test_a_promotion_on_a_full_cluster_keeps_the_live_capacity_at_every_step(monkeypatch, shrink):
    """The driver's promotion on fakes of Ray, a cluster with room for the live version's 3 replicas and the
    candidate's 1: with the old version scalable in place, requests are split, it gives up one replica for each the
    candidate takes, and the replicas answering clients never fall below 3; without (an older server, deployed
    without Ray's external scaler), requests move once the candidate has the 1 + 0 replicas it could get (a note)."""
    from vitdeploy.client.rollout import driver
    from vitdeploy.serve.rollout import candidate

    live, slots = 3, 4
    state = {"old": live, "new": 1, "share": 0.0, "moved": False}
    capacity: list[int] = []
    events: list = []

    def answering() -> int:
        if state["moved"]:
            return state["new"]
        return state["old"] + state["new"] if state["share"] > 0 else state["old"]

    def deploy(replicas, auto):  # the candidate's in-place redeploy: what the free slots allow
        state["new"] = min(replicas, slots - state["old"])
        events.append(("new", state["new"]))
        capacity.append(answering())

    def scale_version(app, replicas):
        assert app == "m"
        state["old"] = replicas
        events.append(("old", replicas))
        capacity.append(answering())

    class Lease:
        def call(self, method, *args):
            if method == "split":
                assert args[2] == live
                state["share"] = args[1]
                events.append(("split", round(args[1], 2)))
            elif method == "promote":
                state["moved"] = True
                events.append(("promote",))
            capacity.append(answering())

    def remove_version(app, timeout_s):
        state["old"] = 0
        events.append(("remove", app))
        return True

    monkeypatch.setattr(driver.time, "sleep", lambda s: None)
    monkeypatch.setattr(candidate, "free_cpus", lambda: float(slots - state["old"] - state["new"]))
    monkeypatch.setattr(candidate, "replica_count", lambda app: state["old"] if app == "m" else state["new"])
    monkeypatch.setattr(candidate, "scale_version", scale_version)
    monkeypatch.setattr(candidate, "remove_version", remove_version)
    details = {"applications": {"m": {"external_scaler_enabled": shrink, "deployments": {"d": {}}}}}
    monkeypatch.setattr("vitdeploy.base.ray_private.serve_details", lambda: details)

    rollout = driver._Rollout.__new__(driver._Rollout)
    rollout.model, rollout.version, rollout.live, rollout.notes = "m", 2, 1, []
    rollout.deployed = (None, None, "m@v2", "/v2/models/m/versions/2", 1.0)
    rollout.plan = driver.RolloutPlan("http://x", "e", start_timeout_s=0.05)
    rollout.cfg = type("Cfg", (), {"serve": type("Sv", (), {"graceful_shutdown_timeout_s": 1})()})()
    rollout.lease, rollout.progress = Lease(), lambda line: None
    monkeypatch.setattr(rollout, "_deploy", deploy)
    rollout.promote()
    assert state["new"] == live and state["moved"]  # the promoted version serves with the live count
    if shrink:
        assert events[:6] == [("split", 0.25), ("old", 2), ("split", 0.33), ("new", 2), ("split", 0.5), ("old", 1)]
        assert min(capacity) >= live and not rollout.notes, (capacity, rollout.notes)
    else:
        assert min(capacity) == 1 and any("moved to v2 with 1 replica(s), v1 had 3" in n for n in rollout.notes)
