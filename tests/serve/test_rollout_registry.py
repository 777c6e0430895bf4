"""The rollout registry (vitdeploy/serve/rollout/registry.py): what it allows and remembers, and the guard routing
by it. Pure Python (the registry is a plain class; Ray runs it as an actor): a real rollout on a real server is
tests/client/test_rollout_driver.py."""

from __future__ import annotations

import asyncio

from vitdeploy.serve.rollout.registry import ABANDONED_S, RolloutRegistry, RoutingTable

SHADOWING = {
    "live": "/v2/models/m",
    "live_app": "m",
    "versions": [1, 2],
    "apps": {"1": "m", "2": "m@v2"},
    "shadow": {"app": "m@v2", "timeout_s": 5.0},
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _registry():
    clock = Clock()
    return RolloutRegistry(clock), clock


def test_versions_are_numbered_on_and_never_reused():
    reg, _ = _registry()
    began = reg.begin("m", {"m": "/v2/models/m"}, {"sha": "a"})
    assert (began["version"], began["live"], began["abandoned"]) == (2, 1, None)
    assert reg.routing()["m"]["versions"] == [1]  # a starting candidate is not listed yet
    reg.ready("m", 2)
    assert reg.routing()["m"]["versions"] == [1, 2]
    reg.drop("m", 2)
    reg.finish("m", {"version": 2, "verdict": "rolled back"})
    assert reg.begin("m", {"m": "/v2/models/m"}, {"sha": "b"})["version"] == 3


def test_a_second_rollout_waits_and_an_abandoned_one_is_taken_over():
    reg, clock = _registry()
    reg.begin("m", {"m": "/v2/models/m"}, {"sha": "a"})
    assert "in progress" in reg.begin("m", {"m": "/v2/models/m"}, {"sha": "b"})["refused"]
    clock.now += ABANDONED_S + 1  # its process went away: no heartbeat
    began = reg.begin("m", {"m": "/v2/models/m", "m@v2": "/v2/models/m/versions/2"}, {"sha": "b"})
    assert began["version"] == 3 and began["abandoned"]["app"] == "m@v2"
    assert reg.status()["history"][-1]["verdict"] == "rolled back"


def test_shadow_records_stop_at_the_budget_and_the_live_version_flips_on_promotion():
    reg, clock = _registry()
    reg.begin("m", {"m": "/v2/models/m"}, {"sha": "a"})
    reg.ready("m", 2)
    reg.start_shadow("m", 2, 5.0, 60.0)
    assert reg.routing()["m"]["shadow"] == {"app": "m@v2", "timeout_s": 5.0}
    for i in range(3):
        reg.record("m", 2, {"live": [i]})
    assert [s["live"] for s in reg.samples("m")] == [[0], [1]]
    assert reg.routing()["m"]["shadow"] is None and reg.progress("m")["count"] == 2
    reg.promote("m", 2)
    routing = reg.routing()["m"]
    assert (routing["live"], routing["live_app"]) == ("/v2/models/m/versions/2", "m@v2")
    reg.drop("m", 1)
    reg.finish("m", {"version": 2, "verdict": "promoted"})
    assert reg.status()["models"]["m"]["live"] == 2 and list(reg.status()["models"]["m"]["versions"]) == ["2"]


def test_a_restarted_server_is_adopted_again():
    reg, _ = _registry()
    reg.begin("m", {"m": "/v2/models/m"}, {"sha": "a"})
    reg.ready("m", 2)
    reg.promote("m", 2)
    reg.drop("m", 1)
    reg.finish("m", {"version": 2, "verdict": "promoted"})
    # the server was restarted: only its version 1 runs; numbering goes on
    began = reg.begin("m", {"m": "/v2/models/m"}, {"sha": "c"})
    assert (began["live"], began["version"]) == (1, 3)


def test_the_guard_routes_by_the_registry_and_drops_a_clients_own_rollout_headers():
    from vitdeploy.serve.proxy_guard import ProxyGuard

    seen = []

    async def ray(scope, receive, send):  # Ray's proxy: records what it was given, answers 200
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    async def read():
        return {"m": {**SHADOWING, "live": "/v2/models/m/versions/2", "shadow": None}}

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
