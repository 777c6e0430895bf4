"""The rollout registry (vitdeploy/serve/rollout/registry.py): what it allows and remembers - leases, fencing, what a
takeover removes by the abandoned rollout's phase, its state read back by a registry started again (store.py) - and
the guard routing by it. Pure Python on a fake clock (the registry is a plain class; Ray runs it as an actor): a real
rollout on a real server is tests/client/test_rollout_driver.py."""

from __future__ import annotations

import asyncio

import pytest

from vitdeploy.serve.rollout.registry import (
    CANDIDATE,
    CONVERGING,
    DRAINING,
    LEASE_S,
    PROMOTED,
    PROMOTING,
    ROLLED_BACK,
    ROLLING_BACK,
    SHADOW,
    STARTING,
    RolloutRegistry,
    RoutingTable,
)
from vitdeploy.serve.rollout.store import MemoryStore, routing_table

PROMOTED_ENTRY = {  # model m after v2's promotion (tests/serve/test_rollout_routes.py routes such entries)
    "live": "/v2/models/m/versions/2",
    "live_app": "m",
    "versions": [1, 2],
    "apps": {"1": "m", "2": "m@v2"},
    "shadow": None,
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _registry(store=None):
    clock = Clock()
    return RolloutRegistry(clock, store), clock


ONE = {"m": "/v2/models/m"}
TWO = {**ONE, "m@v2": "/v2/models/m/versions/2"}


def _promoted(reg, holder="a"):
    """A rollout of v2 by ``holder`` that promoted it; v1 is draining."""
    reg.begin("m", holder, ONE, {"sha": "a"})
    reg.ready("m", holder, 2)
    reg.promote("m", holder, 2)


def test_versions_are_numbered_on_and_never_reused():
    reg, _ = _registry()
    began = reg.begin("m", "a", ONE, {"sha": "a"})
    assert (began["version"], began["live"], began["abandoned"], began["remove"]) == (2, 1, None, [])
    assert reg.routing()["m"]["versions"] == [1]  # a starting candidate is not listed yet
    reg.ready("m", "a", 2)
    assert reg.routing()["m"]["versions"] == [1, 2]
    reg.drop("m", "a", 2)
    reg.finish("m", "a", {"version": 2, "verdict": "rolled back"})
    assert reg.begin("m", "b", ONE, {"sha": "b"})["version"] == 3


def test_a_renewed_lease_is_never_taken_and_an_expired_one_is():
    reg, clock = _registry()
    reg.begin("m", "a", ONE, {"sha": "a"})
    for _ in range(4):  # the rollout's process renews it through a start longer than the lease
        clock.now += LEASE_S * 0.75
        assert reg.renew("m", "a")["expires"] == clock.now + LEASE_S
        refused = reg.begin("m", "b", TWO, {"sha": "b"})
        assert "holds its lease" in refused["refused"] and "v2, starting" in refused["refused"]
    clock.now += LEASE_S + 1  # its process went away: no renewal
    began = reg.begin("m", "b", TWO, {"sha": "b"})
    assert began["version"] == 3 and began["remove"] == [2]
    assert began["abandoned"] == {"version": 2, "phase": STARTING, "verdict": ROLLED_BACK}
    assert reg.status()["history"][-1]["verdict"] == ROLLED_BACK


@pytest.mark.parametrize("step", [STARTING, CANDIDATE, SHADOW, PROMOTING, ROLLING_BACK])
def test_a_takeover_removes_a_candidate_that_never_went_live(step):
    reg, clock = _registry()
    reg.begin("m", "a", ONE, {"sha": "a"})
    if step != STARTING:
        reg.ready("m", "a", 2)
    if step == SHADOW:
        reg.start_shadow("m", "a", 10, 5.0, 60.0)
    if step in (PROMOTING, ROLLING_BACK):
        reg.phase("m", "a", step)
    clock.now += LEASE_S + 1
    began = reg.begin("m", "b", TWO, {"sha": "b"})
    assert began["live"] == 1 and began["remove"] == [2], began
    assert began["abandoned"]["phase"] == step and began["abandoned"]["verdict"] == ROLLED_BACK
    assert reg.routing()["m"]["live"] == "/v2/models/m" and reg.routing()["m"]["shadow"] is None
    assert "live" in reg.drop("m", "b", 1)["refused"]  # whatever is asked, the live version stays
    assert reg.drop("m", "b", 2) == {}


def test_a_rollout_that_died_before_its_candidate_was_deployed_leaves_nothing_behind(monkeypatch):
    """Its version, never deployed, is forgotten at the takeover, and so is its packed export (the registry owns
    it in Ray's object store: it would be kept for the cluster's life)."""
    import ray

    monkeypatch.setattr(ray, "put", lambda bundle: ("ref", bundle))
    reg, clock = _registry()
    reg.begin("m", "a", ONE, {"sha": "a"})
    assert reg.keep("m", "a", "m@v2", b"packed") == [("ref", b"packed")]
    clock.now += LEASE_S + 1  # SIGKILL before its application was deployed: none runs
    began = reg.begin("m", "b", ONE, {"sha": "b"})
    assert began["remove"] == [] and began["abandoned"]["verdict"] == ROLLED_BACK and began["version"] == 3
    assert reg._bundles == {} and list(reg.status()["models"]["m"]["versions"]) == ["1", "3"]


def test_a_takeover_after_a_promotion_never_removes_the_promoted_version():
    reg, clock = _registry()
    _promoted(reg)  # then SIGKILL while v1 drained: no finish
    assert reg.status()["models"]["m"]["rollout"]["phase"] == DRAINING
    clock.now += LEASE_S + 1
    began = reg.begin("m", "b", TWO, {"sha": "b"})
    assert (began["live"], began["remove"], began["version"]) == (2, [1], 3)
    assert began["abandoned"] == {"version": 2, "phase": DRAINING, "verdict": PROMOTED}
    assert reg.routing()["m"]["live"] == "/v2/models/m/versions/2"
    assert "is live" in reg.drop("m", "b", 2)["refused"]
    assert [h["verdict"] for h in reg.status()["history"]] == [PROMOTED]


def test_a_superseded_rollout_can_change_nothing():
    reg, clock = _registry()
    reg.begin("m", "a", ONE, {"sha": "a"})
    reg.ready("m", "a", 2)
    clock.now += LEASE_S + 1
    reg.begin("m", "b", TWO, {"sha": "b"})
    reg.drop("m", "b", 2)
    reg.ready("m", "b", 3)
    reg.start_shadow("m", "b", 10, 5.0, 60.0)
    before = reg.status()
    for method, args in [
        ("renew", ()),
        ("phase", (PROMOTING,)),
        ("ready", (2,)),
        ("start_shadow", (10, 5.0, 60.0)),
        ("progress", ()),
        ("samples", (0,)),
        ("stop_shadow", ()),
        ("promote", (3,)),
        ("drop", (3,)),
        ("finish", ({"version": 2, "verdict": PROMOTED},)),
    ]:
        answer = getattr(reg, method)("m", "a", *args)
        assert answer["fenced"] and "lost its lease" in answer["refused"], method
    assert reg.status() == before and reg.routing()["m"]["shadow"] == {"app": "m@v3", "timeout_s": 5.0}


def test_the_registry_started_again_routes_and_leases_as_before():
    store = MemoryStore()
    reg, clock = _registry(store)
    _promoted(reg)
    again = RolloutRegistry(clock, store)  # the actor died; Ray started it again: it reads the GCS
    assert again.routing() == reg.routing() and again.routing()["m"]["live_app"] == "m@v2"
    assert routing_table(store.load(), clock.now) == reg.routing()  # what the proxies read, without any registry
    assert "holds its lease" in again.begin("m", "b", TWO, {"sha": "b"})["refused"]
    assert again.drop("m", "a", 1) == {} and again.finish("m", "a", {"version": 2, "verdict": PROMOTED}) == {}
    assert RolloutRegistry(clock, store).status()["history"][-1]["verdict"] == PROMOTED


def test_the_status_converges_an_expired_rollout_and_leaves_a_live_one_alone():
    reg, clock = _registry()
    assert reg.recover("m", "s", ONE) == {"remove": [], "abandoned": None, "live": 1}
    assert reg.status()["models"]["m"]["rollout"] is None  # nothing to do: no lease taken
    _promoted(reg)
    assert "holds its lease" in reg.recover("m", "s", TWO)["refused"]
    clock.now += LEASE_S + 1
    taken = reg.recover("m", "s", TWO)
    assert taken["remove"] == [1] and taken["abandoned"]["verdict"] == PROMOTED
    assert reg.status()["models"]["m"]["rollout"]["phase"] == CONVERGING
    reg.drop("m", "s", 1)
    reg.finish("m", "s", None)
    assert reg.status()["models"]["m"]["versions"].keys() == {"2"} and len(reg.status()["history"]) == 1


def test_shadow_records_stop_at_the_budget_and_the_live_version_flips_on_promotion():
    reg, clock = _registry()
    reg.begin("m", "a", ONE, {"sha": "a"})
    reg.ready("m", "a", 2)
    reg.start_shadow("m", "a", 2, 5.0, 60.0)
    assert reg.routing()["m"]["shadow"] == {"app": "m@v2", "timeout_s": 5.0}
    for i in range(3):
        reg.record("m", 2, {"live": [i]})
    assert [s["live"] for s in reg.samples("m", "a")] == [[0], [1]]
    assert reg.routing()["m"]["shadow"] is None and reg.progress("m", "a")["count"] == 2
    reg.promote("m", "a", 2)
    routing = reg.routing()["m"]
    assert (routing["live"], routing["live_app"]) == ("/v2/models/m/versions/2", "m@v2")
    reg.drop("m", "a", 1)
    reg.finish("m", "a", {"version": 2, "verdict": "promoted"})
    assert reg.status()["models"]["m"]["live"] == 2 and list(reg.status()["models"]["m"]["versions"]) == ["2"]


def test_a_restarted_server_is_adopted_again():
    reg, _ = _registry()
    _promoted(reg)
    reg.drop("m", "a", 1)
    reg.finish("m", "a", {"version": 2, "verdict": "promoted"})
    # the server was restarted: only its version 1 runs; numbering goes on
    began = reg.begin("m", "b", ONE, {"sha": "c"})
    assert (began["live"], began["version"]) == (1, 3)


def test_the_guard_routes_by_the_registry_and_drops_a_clients_own_rollout_headers():
    from vitdeploy.serve.proxy_guard import ProxyGuard

    seen = []

    async def ray(scope, receive, send):  # Ray's proxy: records what it was given, answers 200
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    async def read():
        return {"m": dict(PROMOTED_ENTRY)}

    guard = ProxyGuard(ray, max_body_bytes=1 << 20, body_timeout_s=5)
    guard.rollout = RoutingTable(read)
    guard.routes = _routes  # type: ignore[method-assign]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/m/infer",
        "raw_path": b"/v2/models/m/infer",
        "headers": [(b"x-vitdeploy-shadow", b"m@v2 5"), (b"content-length", b"0")],
        "query_string": b"",
    }
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        pass

    asyncio.run(guard(scope, receive, send))
    assert seen[0]["path"] == "/v2/models/m/versions/2/infer"
    headers = dict(seen[0]["headers"])
    assert b"x-vitdeploy-shadow" not in headers and headers[b"x-vitdeploy-versions"] == b"1,2"


async def _routes():
    return {"/v2/models/m/versions/2": "m@v2"}


def test_a_split_promotion_routes_part_of_the_requests_to_the_candidate_until_the_promotion_and_a_takeover_restores():
    """A promotion on a full cluster splits unversioned requests by replica counts (capacity.py's BOTH steps); the
    split ends with the promotion; a rollout abandoned mid-split leaves the live version whole again: its candidate
    is removed, requests all go to it, and the replicas it gave up are given back."""
    reg, clock = _registry()
    reg.begin("m", "a", ONE, {"sha": "a"})
    reg.ready("m", "a", 2)
    reg.phase("m", "a", PROMOTING)
    assert reg.split("m", "a", 2, 2 / 5, 3) == {"share": 0.4}
    split = reg.routing()["m"]["split"]
    assert split == {"app": "m@v2", "route": "/v2/models/m/versions/2", "share": 0.4}
    assert reg.routing()["m"]["live_app"] == "m"  # versioned and metadata requests are unchanged
    assert reg.split("m", "b", 2, 0.5, 3)["fenced"]  # only the holder splits
    reg.promote("m", "a", 2)
    assert reg.routing()["m"]["split"] is None and reg.routing()["m"]["live_app"] == "m@v2"

    reg, clock = _registry()
    reg.begin("m", "a", ONE, {"sha": "a"})
    reg.ready("m", "a", 2)
    reg.split("m", "a", 2, 3 / 5, 3)  # then SIGKILL: v1 has 2 replicas left, v2 has 3
    clock.now += LEASE_S + 1
    began = reg.begin("m", "b", TWO, {"sha": "b"})
    assert began["remove"] == [2] and began["restore"] == {"version": 1, "replicas": 3}
    assert reg.routing()["m"]["split"] is None and reg.routing()["m"]["live_app"] == "m"
    reg.drop("m", "b", 2)
    reg.finish("m", "b", None)
    assert "restore" not in reg.begin("m", "c", ONE, {"sha": "c"})  # a rollout that finished leaves nothing to give


def test_grpc_calls_are_routed_and_tagged_for_a_shadow_copy_as_the_guard_does(monkeypatch):
    """Ray's gRPC proxy gets the application to route a call to in its metadata (serve/kserve_grpc.py): an
    unversioned inference while a shadow runs also carries the copy's target, as the guard's header does for HTTP;
    a versioned call, or another RPC, does not; what a client sends under our prefix is dropped."""
    from types import SimpleNamespace

    from vitdeploy.serve import kserve_grpc
    from vitdeploy.serve.rollout import registry

    shadowing = {**PROMOTED_ENTRY, "live_app": "m", "shadow": {"app": "m@v2", "timeout_s": 5.0}}

    async def read():
        return {"m": shadowing}

    monkeypatch.setattr(registry, "ROUTING", RoutingTable(read))

    class Context:
        def invocation_metadata(self):
            return (("x-vitdeploy-shadow", "m@v9 1"), ("authorization", "Bearer t"))

    def routed(version="", infer=True):
        request = SimpleNamespace(model_name="m", model_version=version)
        context = asyncio.run(kserve_grpc.routed_context(request, Context(), infer))
        return dict(context.invocation_metadata())

    assert routed() == {"authorization": "Bearer t", "application": "m", "x-vitdeploy-shadow": "m@v2 5"}
    assert routed(infer=False) == {"authorization": "Bearer t", "application": "m"}  # metadata: no copy
    assert routed("2") == {"authorization": "Bearer t", "application": "m@v2"}  # the candidate itself: no copy
    shadowing.update(shadow=None, split={"app": "m@v2", "route": "/v2/models/m/versions/2", "share": 1.0})
    monkeypatch.setattr(registry, "ROUTING", RoutingTable(read))
    assert routed() == {"authorization": "Bearer t", "application": "m@v2"}  # a split sends its share there
