"""What `vitdeploy rollout` asks the running server over HTTP before it touches anything, and after.

The server must be `vitdeploy serve` with its proxy's guard (``GET /v2`` answers ``{"name": "vitdeploy", ...}``:
the guard routes unversioned requests to the live version); the serve token is probed (a server without one
answers without it; a server with one refuses another); the model is the one named, or the only one served.
Every request goes through the one HTTP client (client/connection.py: the token, the CA bundle of an HTTPS server).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import urlsplit

from ...base.errors import BackendError, ConfigError, first_line
from ...serve.auth import TOKEN_ENV, digest
from ...serve.protocol import EXPORT_SHA256, served_export
from ..connection import CaBundle, open_http, transport_errors

TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Server:
    """The running server as `vitdeploy rollout` found it: its URL, the model, the serve token's digest the
    candidate must require (None: the server has no token), the live version's v2 metadata, the CA bundle its
    certificate is verified against (HTTPS; None: the system's trust store)."""

    url: str
    model: str
    token: Optional[str] = field(repr=False)
    token_digest: Optional[str] = field(repr=False)
    metadata: dict[str, Any]
    ca_bundle: CaBundle = None


def export_sha(artifacts: Any) -> str:
    """Which export this is: the sha256 of its manifest.json's bytes (the manifest lists every file's sha256)."""
    return artifacts.manifest_sha256


def served_sha(metadata: Any) -> Optional[str]:
    """The export a server's v2 metadata says it runs (None when it does not say)."""
    return served_export(metadata).get(EXPORT_SHA256)


def get(url: str, path: str, token: Optional[str] = None, ca_bundle: CaBundle = None) -> tuple[int, Any]:
    """``GET url+path`` (with the serve token when given): (status, the JSON body or None); BackendError (exit 1)
    when the server cannot be reached."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"URL {url!r}: expected http://host:port of a running `vitdeploy serve`")
    with open_http(parts.geturl(), token, ca_bundle, TIMEOUT_S) as http:
        try:
            response = http.get(path)
        except transport_errors() as exc:
            raise BackendError(f"cannot reach {url}: {first_line(exc)}") from None
    body = response.content
    try:
        return response.status_code, json.loads(body) if body else None
    except ValueError:
        return response.status_code, None


def find_server(url: str, model: Optional[str], token: Optional[str], ca_bundle: CaBundle = None) -> Server:
    """The server at ``url``, checked: vitdeploy's guard in front, the token it needs, the model it serves
    (``ca_bundle``: what an HTTPS server's certificate is verified against)."""
    url = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
    status, doc = get(url, "/v2", None, ca_bundle)
    needs_token = status == 401
    if needs_token:
        if not token:
            raise ConfigError(f"{url} needs the serve token: set {TOKEN_ENV} (or serve.token_file) as for `serve`")
        status, doc = get(url, "/v2", token, ca_bundle)
        if status == 401:
            raise ConfigError(f"{url} refuses the serve token given ({TOKEN_ENV} or serve.token_file)")
    if status != 200 or not isinstance(doc, dict) or doc.get("name") != "vitdeploy":
        raise BackendError(
            f"{url} is not a `vitdeploy serve` with its proxy's guard (GET /v2 answered {status}); a rollout "
            "needs the guard to route the versions (docs/serving.md)"
        )
    models = [str(m) for m in doc.get("models") or []]
    if model is None:
        if len(models) != 1:
            raise ConfigError(f"{url} serves {', '.join(models) or 'no model'}: name one with --model")
        model = models[0]
    elif model not in models:
        raise ConfigError(f"--model {model}: {url} serves {', '.join(models) or 'no model'}")
    sent = token if needs_token else None
    status, meta = get(url, f"/v2/models/{model}", sent, ca_bundle)
    if status != 200 or not isinstance(meta, dict):
        raise BackendError(f"{url}: GET /v2/models/{model} answered {status}")
    return Server(url, model, sent, digest(token) if needs_token else None, meta, ca_bundle)


def wait_reachable(server: Server, route: str, timeout_s: float) -> None:
    """Wait until ``route``/ready answers 200 through the server's proxy (its route table is updated a moment
    after the application runs); BackendError when it does not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    status = 0
    while time.monotonic() < deadline:
        status, _ = get(server.url, f"{route}/ready", server.token, server.ca_bundle)
        if status == 200:
            return
        time.sleep(0.2)
    raise BackendError(f"{server.url}{route}/ready did not answer 200 within {timeout_s:g} s (last: {status})")


__all__ = ["Server", "export_sha", "find_server", "get", "served_sha", "wait_reachable"]
