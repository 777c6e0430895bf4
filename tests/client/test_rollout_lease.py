"""A rollout process's side of the registry (vitdeploy/client/rollout/lease.py): its lease renewed in the
background, lost to a takeover (every later change refused, the renewals stop), and `rollout --status` converging
what an abandoned rollout left (status.py says it). The plain registry on a fake clock behind a stand-in for Ray;
the real thing on a real server is tests/client/test_rollout_driver.py."""

from __future__ import annotations

import time

import pytest

from vitdeploy.base.errors import BackendError
from vitdeploy.client.rollout import lease as lease_module
from vitdeploy.client.rollout.lease import Lease, converge_all
from vitdeploy.client.rollout.status import format_status
from vitdeploy.serve.rollout.registry import DRAINING, LEASE_S, PROMOTED, RolloutRegistry

ONE = {"m": "/v2/models/m"}
TWO = {**ONE, "m@v2": "/v2/models/m/versions/2"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Actor:
    """A plain object as Ray's handle shows an actor: ``handle.method.remote(*args)``; :class:`FakeRay`'s
    ``get`` returns the answer."""

    def __init__(self, target) -> None:
        self._target = target

    def __getattr__(self, name):
        method = getattr(self._target, name)
        return type("Method", (), {"remote": staticmethod(method)})


class FakeRay:
    @staticmethod
    def get(value):
        return value


@pytest.fixture
def cluster(monkeypatch):
    """The registry, its clock, the model's running applications and the ones removed."""
    clock = Clock()
    reg = RolloutRegistry(clock)
    state = {"running": dict(TWO), "removed": []}

    def remove_version(app, timeout_s):
        state["removed"].append(app)
        state["running"].pop(app, None)
        return True

    monkeypatch.setattr(lease_module, "registry_actor", lambda create=False: Actor(reg))
    monkeypatch.setattr("vitdeploy.serve.rollout.candidate.running_versions", lambda model: dict(state["running"]))
    monkeypatch.setattr("vitdeploy.serve.rollout.candidate.remove_version", remove_version)
    return reg, clock, state


def test_a_lease_taken_over_refuses_every_change_and_stops_renewing(cluster):
    reg, clock, _ = cluster
    mine = Lease(FakeRay(), "m", lease_s=0.2)  # renewed every 0.05 s
    assert mine.call("begin", ONE, {"sha": "a"}, mine.lease_s)["version"] == 2
    mine.hold()
    for _ in range(4):  # 0.6 s of the registry's clock in all: only renewals keep the lease
        clock.now += 0.15
        time.sleep(0.15)  # a few renewals (every 0.05 s) read the clock
        assert "holds its lease" in reg.begin("m", "other", ONE, {"sha": "b"})["refused"]
    assert mine.lost is None
    mine.release()
    clock.now += 1  # no renewal for longer than the lease: another rollout takes it over
    assert reg.begin("m", "other", TWO, {"sha": "b"})["remove"] == [2]
    with pytest.raises(BackendError, match="lost its lease"):
        mine.call("phase", DRAINING)
    assert mine.lost and reg.status()["models"]["m"]["rollout"]["phase"] == "starting"
    with pytest.raises(BackendError, match="lost its lease"):  # said once, then refused without asking
        mine.call("finish", None)


def test_the_status_converges_a_rollout_that_died_after_its_promotion(cluster):
    reg, clock, state = cluster
    reg.begin("m", "gone", ONE, {"sha": "a"})
    reg.ready("m", "gone", 2)
    reg.promote("m", "gone", 2)  # then SIGKILL while v1 drained
    assert converge_all(FakeRay(), Actor(reg)) == []  # its lease still runs: left alone
    clock.now += LEASE_S + 1
    done = converge_all(FakeRay(), Actor(reg))
    assert done == ["m: removing v1, left by the rollout of v2, abandoned while draining (promoted)"]
    assert state["removed"] == ["m"] and reg.routing()["m"]["live_app"] == "m@v2"
    status = reg.status()
    assert status["models"]["m"]["rollout"] is None and list(status["models"]["m"]["versions"]) == ["2"]
    assert [h["verdict"] for h in status["history"]] == [PROMOTED]
    lines = format_status({**status, "converged": done})
    assert lines[:2] == [done[0], "m: live v2 (v2 live)"] and "its process was not heard of" in lines[-1]
    assert converge_all(FakeRay(), Actor(reg)) == []  # nothing left to do


@pytest.mark.parametrize(
    "given, env, joined",
    [
        (None, None, "127.0.0.1:6390"),
        (None, "10.0.0.7:6379", "10.0.0.7:6379"),
        ("10.0.0.9:6379", "10.0.0.7:6379", "10.0.0.9:6379"),
    ],
)
def test_without_an_address_the_cluster_on_this_machine_is_joined_and_named(monkeypatch, given, env, joined):
    """--address, else RAY_ADDRESS, else the cluster running here (as address "auto" finds it), joined by its
    address through init_ray (its token, loopback) and named in one line. Nothing starts: the join is recorded."""
    import ray

    asked, lines = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(lease_module, "init_ray", lambda ray_module, address, **options: asked.append(address))
    monkeypatch.setattr(lease_module, "find_local_cluster", lambda: "127.0.0.1:6390")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if env:
        monkeypatch.setenv("RAY_ADDRESS", env)
    lease_module.connect(given, lines.append)
    assert asked == [joined]
    found = "joined the Ray cluster at 127.0.0.1:6390, found on this machine (no --address or RAY_ADDRESS given)"
    assert lines == ([found] if given is None and env is None else [])


def test_the_cluster_on_this_machine_is_the_one_recorded_or_the_only_one_else_one_line_asks_for_the_address():
    from vitdeploy.base.errors import ConfigError
    from vitdeploy.base.ray_join import choose_local_cluster

    assert choose_local_cluster(None, ["127.0.0.1:6390"]) == "127.0.0.1:6390"
    assert choose_local_cluster("10.0.0.2:6379", ["10.0.0.2:6379", "127.0.0.1:6390"]) == "10.0.0.2:6379"
    assert choose_local_cluster("10.0.0.3:6379", []) == "10.0.0.3:6379"  # `ray start --address` of a worker node
    with pytest.raises(ConfigError, match=r"^no Ray cluster runs on this machine: give --address or RAY_ADDRESS"):
        choose_local_cluster(None, [])
    with pytest.raises(ConfigError, match=r"several Ray clusters run on this machine \(127.0.0.1:1, 127.0.0.1:2\)"):
        choose_local_cluster(None, ["127.0.0.1:1", "127.0.0.1:2"])  # Ray would take either: never guessed
    with pytest.raises(ConfigError, match="several"):
        choose_local_cluster("10.9.9.9:6379", ["127.0.0.1:1", "127.0.0.1:2"])  # a stale record


def test_the_status_gives_the_live_version_back_the_replicas_an_abandoned_split_promotion_took(cluster, monkeypatch):
    """A rollout killed while it stepped the live version down on a full cluster (3 replicas, 2 left): the
    takeover removes the candidate, then scales the live version back to 3 in place."""
    reg, clock, state = cluster
    scaled, counts = [], {"m": 2}
    monkeypatch.setattr("vitdeploy.serve.rollout.candidate.replica_count", lambda app: counts.get(app, 0))
    monkeypatch.setattr(
        "vitdeploy.serve.rollout.candidate.scale_version", lambda app, n: scaled.append((app, n)) or None
    )
    reg.begin("m", "gone", ONE, {"sha": "a"})
    reg.ready("m", "gone", 2)
    reg.split("m", "gone", 2, 2 / 4, 3)  # then SIGKILL
    clock.now += LEASE_S + 1
    done = converge_all(FakeRay(), Actor(reg))
    assert state["removed"] == ["m@v2"] and scaled == [("m", 3)], (done, scaled)
    assert done[-1].startswith("m: giving v1 back its 3 replica(s), left by the rollout of v2, abandoned"), done
    assert reg.routing()["m"]["split"] is None and reg.routing()["m"]["live_app"] == "m"
    counts["m"] = 3
    assert converge_all(FakeRay(), Actor(reg)) == [] and scaled == [("m", 3)]  # once
