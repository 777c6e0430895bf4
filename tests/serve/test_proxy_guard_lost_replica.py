"""The proxy's guard when the replica serving a request dies (vitdeploy/serve/proxy_guard.py), at the
ASGI level: Ray's proxy stands in as a made-up inner app that behaves as Ray's does (it returns without
an answer, or raises Ray's actor error). This checks our own logic - one more try with the buffered
body, then a retryable JSON 503 - on every path; a real replica killed under load: test_ray_app_chaos.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray", reason="the guard runs inside Ray's proxy (pip install 'vitdeploy[serve]')")

from ray.exceptions import ActorDiedError  # noqa: E402

from vitdeploy.serve.proxy_guard import REPLICA_STOPPED, ProxyGuard  # noqa: E402

SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v2/models/m/infer",
    "raw_path": b"/v2/models/m/infer",
    "headers": [(b"content-length", b"4")],
    "query_string": b"",
}


class Ray:
    """Ray's proxy as the guard sees it: each call is one attempt, scripted by ``outcomes`` ("none": returns
    without answering, as Ray's proxy does when the replica died; "died": raises the actor error;
    "boom": another error; an int: answers that status with a JSON body)."""

    def __init__(self, *outcomes) -> None:
        self.outcomes, self.calls = list(outcomes), []

    async def __call__(self, scope, receive, send) -> None:
        message = await receive()
        self.calls.append(message["body"])
        scope["path"] = "/infer"  # Ray's proxy rewrites the scope it gets (the route prefix stripped)
        outcome = self.outcomes.pop(0)
        if outcome == "died":
            raise ActorDiedError()
        if outcome == "boom":
            raise ValueError("something else")
        if isinstance(outcome, int):
            body = json.dumps({"ok": True} if outcome == 200 else {"error": "the model call failed"}).encode()
            await send({"type": "http.response.start", "status": outcome, "headers": []})
            await send({"type": "http.response.body", "body": body, "more_body": False})


def _call(app: Ray) -> tuple[int, dict, dict]:
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": b"data", "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that stays connected

    async def send(message):
        sent.append(message)

    asyncio.run(ProxyGuard(app, max_body_bytes=1 << 20, body_timeout_s=5)(dict(SCOPE), receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), json.loads(body)


@pytest.mark.parametrize("lost", ["none", "died"])
def test_a_request_that_lost_its_replica_is_sent_once_more_with_its_body(lost):
    app = Ray(lost, 200)
    status, _, body = _call(app)
    assert status == 200 and body == {"ok": True} and app.calls == [b"data", b"data"]
    assert SCOPE["path"] == "/v2/models/m/infer"  # each attempt gets its own copy of the scope


@pytest.mark.parametrize("lost", [("none", "none"), ("died", "died"), ("none", "died")])
def test_lost_twice_is_a_retryable_json_503(lost):
    app = Ray(*lost)
    status, headers, body = _call(app)
    assert (status, body) == (503, {"error": REPLICA_STOPPED}) and headers[b"retry-after"] == b"1"
    assert len(app.calls) == 2


def test_an_answer_of_the_model_is_never_retried_and_another_error_is_a_json_500():
    app = Ray(500)
    status, _, body = _call(app)
    assert (status, body) == (500, {"error": "the model call failed"}) and len(app.calls) == 1
    app = Ray("boom")
    status, _, body = _call(app)
    assert status == 500 and body["error"].startswith("internal server error (ValueError)") and len(app.calls) == 1


# -- gRPC: Ray's proxy handler wrapped (vitdeploy/serve/kserve_grpc.py) -------------------------------------


class _Context:
    """What Ray's gRPC handler gets: a status code and details it sets (grpc's ServicerContext)."""

    def __init__(self) -> None:
        import grpc

        self._code, self._details = grpc.StatusCode.OK, ""

    def code(self):
        return self._code

    def details(self):
        return self._details

    def set_code(self, code) -> None:
        self._code = code

    def set_details(self, details) -> None:
        self._details = details


def _grpc_call(*outcomes):
    """Ray's handler answering each attempt as scripted ("died": INTERNAL with Ray's actor-death text;
    "internal": another INTERNAL; "ok": a response) -> (the status, details, response, attempts)."""
    import grpc

    from vitdeploy.serve.kserve_grpc import _retry_lost

    script, calls = list(outcomes), []

    def factory(service_method, streaming_type):
        async def handler(request, context):
            calls.append(request)
            outcome = script.pop(0)
            if outcome == "died":
                context.set_code(grpc.StatusCode.INTERNAL)
                context.set_details("The actor died unexpectedly before finishing this task.\n\tactor_id: 8cc69")
                return b""
            if outcome == "internal":
                context.set_code(grpc.StatusCode.INTERNAL)
                context.set_details("something else broke")
                return b""
            return b"response"

        return handler

    unary = type("StreamingType", (), {"name": "UNARY_UNARY"})()
    handler = _retry_lost(factory)(service_method="/inference.GRPCInferenceService/ModelInfer", streaming_type=unary)
    context = _Context()
    response = asyncio.run(handler(b"request", context))
    return context.code(), context.details(), response, len(calls)


def test_a_grpc_call_that_lost_its_replica_is_sent_once_more_then_unavailable():
    import grpc

    assert _grpc_call("died", "ok") == (grpc.StatusCode.OK, "", b"response", 2)
    code, details, _, calls = _grpc_call("died", "died")
    assert (code, details, calls) == (grpc.StatusCode.UNAVAILABLE, REPLICA_STOPPED, 2)  # no Ray internals
    code, details, _, calls = _grpc_call("internal")  # not a lost replica: as Ray answered it, once
    assert (code, details, calls) == (grpc.StatusCode.INTERNAL, "something else broke", 1)
