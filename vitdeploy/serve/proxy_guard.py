"""The guard in front of Ray Serve's HTTP proxy: bodies read with a deadline and a byte limit before
any replica sees the request, server-level routes answered in the proxy, every refusal as JSON.

Ray Serve runs it inside its proxy actor (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` =
:data:`CALLBACK`, set by `vitdeploy serve` before it starts Ray, and in the generated RayService).
Per request:

* without the serve token (serve/auth.py), every route but the health routes gets 401 before its
  body is read;
* ``/v2/health/live`` (the proxy is up), ``/v2/health/ready`` (a model is routed here) and ``/v2``
  are answered here: a busy or stalled model never delays a liveness probe;
* the body is read here, all of it, with a deadline (``serve.body_timeout_s``: a stalled or
  slow upload gets 408 and its socket is closed) and a limit on the bytes actually read
  (``serve.max_request_mb``, chunked or not: 413 as soon as the limit is passed, the rest is never
  read); the replica then gets the whole body in one message instead of pulling it chunk by chunk;
* ``/predict`` goes to the one model served here (``/v2/models/<name>/predict``); with several,
  each answers under its own prefix;
* any error response of Ray's proxy or of a framework (text, ``{"detail": ...}``) is rewritten to
  ``{"error": "<one line>"}``; a route that served a model and is gone (the app is stopping or
  restarting) answers 503, retryable, instead of Ray's 404.

Configured by environment variables (the proxy's process inherits them from the raylet).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from typing import Any, Awaitable, Callable

from ..base.errors import (
    BodyTooLargeError,
    NotFoundError,
    RequestError,
    RequestTimeoutError,
    UnavailableError,
    first_line,
)
from ..base.ray_private import PROXY_CALLBACK_ENV
from . import auth
from .http_errors import MAX_REASON, error_body, status_of
from .rollout.registry import ROUTING
from .rollout.routes import HEADER_PREFIX, routed

log = logging.getLogger(__name__)

CALLBACK = "vitdeploy.serve.proxy_guard.middlewares"
CALLBACK_ENV = PROXY_CALLBACK_ENV.variable
MAX_BODY_ENV = "VITDEPLOY_MAX_REQUEST_BYTES"
BODY_TIMEOUT_ENV = "VITDEPLOY_BODY_TIMEOUT_S"
MODELS_PREFIX = "/v2/models/"
REPLICA_STOPPED = "the replica serving this request stopped before it answered; retry"
LOST_REQUEST_RETRIES = 1  # a request whose replica died is sent once more before the client gets 503
_ROUTES_TTL_S = 1.0
_OURS = HEADER_PREFIX.encode()

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def env_for(max_request_bytes: int, body_timeout_s: float) -> dict[str, str]:
    """The environment variables that install and configure the guard in Ray's proxy."""
    return {CALLBACK_ENV: CALLBACK, MAX_BODY_ENV: str(int(max_request_bytes)), BODY_TIMEOUT_ENV: f"{body_timeout_s:g}"}


def middlewares() -> list[Any]:
    """Ray Serve's proxy callback: the guard as a Starlette middleware, configured from the environment."""
    from starlette.middleware import Middleware

    return [
        Middleware(
            ProxyGuard,
            max_body_bytes=int(os.environ.get(MAX_BODY_ENV, 64 << 20)),
            body_timeout_s=float(os.environ.get(BODY_TIMEOUT_ENV, 30)),
            token_digest=auth.digest_from_environment(),
        )
    ]


def model_of(path: str) -> str | None:
    """``/v2/models/<name>/...`` -> ``<name>``."""
    if not path.startswith(MODELS_PREFIX):
        return None
    return path[len(MODELS_PREFIX) :].split("/", 1)[0] or None


async def _answer(
    send: Send,
    status: int,
    body: bytes = b"",
    ctype: str = "application/json",
    close: bool = False,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()), *(extra or [])]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def answer_error(send: Send, exc: BaseException, close: bool = False) -> None:
    status = status_of(exc)
    extra = {503: [(b"retry-after", b"1")], 401: [auth.CHALLENGE]}.get(status)
    await _answer(send, status, error_body(exc), close=close, extra=extra)


class ProxyGuard:
    """ASGI middleware around Ray Serve's proxy app (see the module's docstring)."""

    def __init__(self, app: Any, max_body_bytes: int, body_timeout_s: float, token_digest: str | None = None) -> None:
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.body_timeout_s = float(body_timeout_s)
        self.token_digest = token_digest  # serve/auth.py: None = no token, every route open
        self._routes: dict[str, str] = {}
        self._routes_at = 0.0
        self._seen: set[str] = set()  # models routed here once: their 404 means "stopping", a 503
        self.rollout = ROUTING  # which version of a model is live (serve/rollout/registry.py)

    # ---------------------------------------------------------------- routes of Ray's proxy

    async def routes(self) -> dict[str, str]:
        """Ray's route table {route prefix: app}, from the proxy's own ``/-/routes`` (cached 1 s)."""
        if time.monotonic() - self._routes_at < _ROUTES_TTL_S:
            return self._routes
        chunks: list[bytes] = []
        status: list[int] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/-/routes",
            "raw_path": b"/-/routes",
            "query_string": b"",
            "root_path": "",
            "headers": [],
            "client": None,
            "server": None,
        }
        try:
            await self.app(scope, receive, send)
            table = json.loads(b"".join(chunks)) if status and status[0] == 200 else {}
        except Exception as exc:  # noqa: BLE001 - the proxy not ready yet: no routes
            log.debug("reading /-/routes: %s", exc)
            table = {}
        self._routes = {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else {}
        self._routes_at = time.monotonic()
        self._seen.update(m for m in map(model_of, self._routes) if m)
        return self._routes

    async def models(self) -> list[str]:
        return sorted({m for m in map(model_of, await self.routes()) if m})

    # ---------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/-/"):
            return await self.app(scope, receive, send)
        path = scope["path"].rstrip("/") or "/"
        if self.token_digest is not None and not auth.is_open(path):
            try:  # before the body is read: a caller without the token costs no upload
                auth.authorize(dict(scope.get("headers") or []).get(b"authorization"), self.token_digest)
            except RequestError as exc:
                return await answer_error(send, exc, close=True)
        if path in ("/v2/health/live", "/v2/health/ready", "/v2"):
            return await self._server_route(path, send)
        try:
            body = await self._read_body(scope, receive)
        except RequestError as exc:
            # the rest of the body is never read: the connection is closed after this answer
            return await answer_error(send, exc, close=True)
        except OSError:  # the client went away mid-upload: nothing to answer, nothing to log
            return None
        try:
            scope = await self._target(scope, path)
        except RequestError as exc:
            return await answer_error(send, exc)
        for attempt in range(1 + LOST_REQUEST_RETRIES):
            errors = _JsonErrors(send, self, scope["path"])
            try:
                await self.app(dict(scope), _replay(body, receive), errors)  # Ray's proxy rewrites its scope
            except Exception as exc:  # noqa: BLE001 - whatever Ray's proxy raised: the client gets one JSON line
                if errors.started:  # the answer is half sent: nothing to replace it with
                    raise
                if replica_died(exc) and attempt < LOST_REQUEST_RETRIES:
                    continue
                return await answer_error(send, _replica_fault(exc))
            if errors.started or errors.start is not None or await _disconnected(receive):
                return None
            # Ray's proxy returns without an answer when the replica serving the request died (it logs
            # the RayActorError; uvicorn would then send a text/plain 500). Our application always
            # answers, so an unanswered request lost its replica: the body is still here, and an
            # inference has no side effect, so it is sent once more (another replica, or the one Ray
            # starts in its place, answers it); lost twice, the client gets a retryable 503
            log.warning("a request lost its replica before it was answered (attempt %d)", attempt + 1)
        await answer_error(send, UnavailableError(REPLICA_STOPPED))

    async def _target(self, scope: Scope, path: str) -> Scope:
        """The scope Ray's proxy gets: ``/predict`` sent to the one model served here, an unversioned model route
        to its live version (serve/rollout/routes.py), the headers the replica reads from the guard set here alone."""
        if path == "/predict":
            models = await self.models()
            if len(models) != 1:
                raise NotFoundError(
                    "no model is served here yet"
                    if not models
                    else f"several models are served here ({', '.join(models)}): POST /v2/models/<name>/predict"
                )
            path = f"{MODELS_PREFIX}{models[0]}/predict"
        else:
            path = scope["path"]
        model = model_of(path)
        if model is None:
            return scope
        headers = [(k, v) for k, v in scope.get("headers") or [] if not k.lower().startswith(_OURS)]
        entry = (await self.rollout.table()).get(model)  # a rollout put a version beside the first one
        path, extra = routed(path, scope.get("method", "GET"), model, entry, random.random())
        stripped = path.rstrip("/")
        # a version's metadata route is its application's root, "/"
        if stripped == MODELS_PREFIX + model or (entry and stripped in await self.routes()):
            path = stripped + "/"
        headers += [(k.encode(), v.encode()) for k, v in extra]
        return {**scope, "path": path, "raw_path": path.encode(), "headers": headers}

    async def _server_route(self, path: str, send: Send) -> None:
        if path == "/v2/health/live":
            return await _answer(send, 200)
        models = await self.models()
        if path == "/v2/health/ready":
            if models:
                return await _answer(send, 200)
            return await answer_error(send, UnavailableError("no model is ready yet"))
        from ..base.version import __version__

        body = json.dumps(
            {
                "name": "vitdeploy",
                "version": __version__,
                "extensions": ["binary_tensor_data", "model_configuration", "statistics"],
                "models": models,
            }
        ).encode()
        return await _answer(send, 200, body)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, within the deadline and the byte limit (declared or actually read)."""
        limit = self.max_body_bytes
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(
                f"request body of {int(declared)} bytes is over the limit of {limit} bytes (serve.max_request_mb)"
            )
        deadline = time.monotonic() + self.body_timeout_s
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.0))
            except asyncio.TimeoutError:
                raise RequestTimeoutError(
                    f"the request body did not arrive within {self.body_timeout_s:g} s "
                    f"(serve.body_timeout_s); {size} bytes were received"
                ) from None
            if message["type"] == "http.disconnect":
                raise ConnectionAbortedError("client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(f"request body is over the limit of {limit} bytes (serve.max_request_mb)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _disconnected(receive: Receive) -> bool:
    """Whether the client is gone (Ray's proxy answers nothing to a client that disconnected: 499)."""
    try:
        message = await asyncio.wait_for(receive(), timeout=0.001)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - nothing to read: still connected
        return False
    return message.get("type") == "http.disconnect"


def replica_died(exc: BaseException) -> bool:
    """Whether Ray's proxy failed the request because the replica serving it stopped (killed, crashed,
    out of memory, its node gone): Ray's actor errors, by class."""
    try:
        from ray.exceptions import ActorUnavailableError, RayActorError
    except ImportError:  # pragma: no cover - the guard runs inside Ray's proxy
        return False
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # Ray may wrap it (RayTaskError, its cause)
        seen.add(id(exc))
        if isinstance(exc, (RayActorError, ActorUnavailableError)):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def _replica_fault(exc: BaseException) -> BaseException:
    """What the client of a request Ray's proxy failed is told: a retryable 503 when its replica stopped
    (another replica, or the one Ray starts in its place, answers the retry), else a 500."""
    if replica_died(exc):
        log.warning("a request lost its replica (%s): answered 503, retry", type(exc).__name__)
        return UnavailableError(REPLICA_STOPPED)
    log.error("Ray's proxy failed a request: %s", first_line(exc))
    return exc  # answered 500 {"error": "internal server error (<type>); see the server's log"}


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body in one message, then the client's own messages (a disconnect, later)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class _JsonErrors:
    """A ``send`` that rewrites every error response that is not ``{"error": ...}`` into one."""

    def __init__(self, send: Send, guard: ProxyGuard, path: str) -> None:
        self.send, self.guard, self.path = send, guard, path
        self.start: Message | None = None
        self.body: list[bytes] = []
        self.started = False  # a response start was sent on: the answer can no longer be replaced

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            self.start = message
            return None
        if message["type"] == "http.response.start":
            self.started = True
        if self.start is None or message["type"] != "http.response.body":
            return await self.send(message)
        self.body.append(message.get("body", b""))
        if message.get("more_body", False):
            return None
        return await self._flush()

    async def _flush(self) -> None:
        assert self.start is not None
        status, raw = self.start["status"], b"".join(self.body)
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and set(doc) == {"error"} and isinstance(doc["error"], str):
            await self.send(self.start)
            return await self.send({"type": "http.response.body", "body": raw, "more_body": False})
        text = doc.get("detail") if isinstance(doc, dict) else raw.decode("utf-8", "replace")
        model = model_of(self.path)
        if status == 404 and model:  # Ray's proxy has no route for it (our app's 404s are JSON already)
            await self.guard.models()
            if model in self.guard._seen:
                status, text = 503, f"model {model!r} is not available right now (stopping or restarting); retry"
            else:
                text = f"unknown model {model!r}; served here: {', '.join(await self.guard.models()) or 'none yet'}"
        elif status >= 500 and status != 503:
            text = f"internal server error (HTTP {status}); see the server's log"
        extra = [(b"retry-after", b"1")] if status == 503 else None
        await _answer(self.send, status, error_body(first_line(text or f"HTTP {status}", MAX_REASON)), extra=extra)
