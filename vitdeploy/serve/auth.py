"""Who may call the model: one bearer token, checked in constant time, never logged or written.

The token comes from the environment variable ``VITDEPLOY_SERVE_TOKEN`` or from the file named by
``serve.token_file`` (so that it stays out of ``pipeline.yaml``; not both). Every model route then
requires ``Authorization: Bearer <token>`` - ``/predict``, the v2 inference, metadata, config and
statistics routes, the server metadata ``/v2``, and the gRPC methods (the same ``authorization``
metadata) - and answers 401 ``{"error": ...}`` with ``WWW-Authenticate: Bearer`` (gRPC:
UNAUTHENTICATED) without it. The health routes (``/v2/health/live``, ``/v2/health/ready``, a model's
``/ready``; gRPC ``ServerLive``, ``ServerReady``, ``ModelReady``) stay open for probes, as Triton's
"health" API group does.

What travels to Ray's processes is the token's SHA-256 (:func:`digest`), never the token: the
proxy's guard reads it from ``VITDEPLOY_SERVE_TOKEN_SHA256`` (set by `vitdeploy serve` before it
starts Ray; on a cluster of one's own, the guard hashes ``VITDEPLOY_SERVE_TOKEN`` from its
environment), each replica gets it in its spec. A given token is hashed and the two digests compared
with :func:`hmac.compare_digest`, so the comparison takes the same time wherever they differ.

No Ray, no FastAPI here.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..base.errors import ConfigError, UnauthorizedError

TOKEN_ENV = "VITDEPLOY_SERVE_TOKEN"
DIGEST_ENV = "VITDEPLOY_SERVE_TOKEN_SHA256"
MIN_LENGTH = 16
#: the routes a probe may call without the token (the proxy's guard answers the first two itself)
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")
CHALLENGE = (b"www-authenticate", b'Bearer realm="vitdeploy"')
MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def is_open(path: str) -> bool:
    """Whether a probe may call ``path`` without the token: the health routes, a model's ``/ready``."""
    path = path.rstrip("/") or "/"
    return path in OPEN_PATHS or (path.startswith("/v2/models/") and path.endswith("/ready"))


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if not token:
        raise ConfigError(f"{where} is empty; put a token in it (make one with {MAKE_ONE})")
    if len(token) < MIN_LENGTH or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(
            f"{where}: the token must be at least {MIN_LENGTH} printable characters without spaces "
            f"(make one with {MAKE_ONE})"
        )
    return token


def read_token(token_file: str | Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The serve token from ``VITDEPLOY_SERVE_TOKEN`` or ``token_file`` (serve.token_file); None when
    neither is set. ConfigError naming the variable or the file (never the token) when it is unusable."""
    env = os.environ if environ is None else environ
    from_env = env.get(TOKEN_ENV)
    if from_env is not None and token_file:
        raise ConfigError(f"the serve token is set twice: {TOKEN_ENV} and serve.token_file ({token_file}); keep one")
    if from_env is not None:
        return _checked(from_env, TOKEN_ENV)
    if not token_file:
        return None
    path = Path(token_file).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(f"serve.token_file {path}: cannot read it ({reason})") from None
    return _checked(text, f"serve.token_file {path}")


def digest_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """What the proxy's guard checks against: ``VITDEPLOY_SERVE_TOKEN_SHA256``, else the digest of
    ``VITDEPLOY_SERVE_TOKEN``; None when neither is set (no token: every route open)."""
    env = os.environ if environ is None else environ
    if env.get(DIGEST_ENV):
        return env[DIGEST_ENV].strip().lower()
    token = env.get(TOKEN_ENV, "").strip()
    return digest(token) if token else None


def bearer(authorization: str | bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value; None when absent or another scheme."""
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def authorize(authorization: str | bytes | None, expected: str | None) -> None:
    """UnauthorizedError unless ``authorization`` carries the token whose digest is ``expected``
    (None: no token configured, anyone may call)."""
    if expected is None:
        return
    token = bearer(authorization)
    if token is None:
        raise UnauthorizedError("this route needs the serve token: send the header Authorization: Bearer <token>")
    if not hmac.compare_digest(digest(token), expected):
        raise UnauthorizedError("the serve token sent in Authorization does not match")


def from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The ``authorization`` entry of gRPC invocation metadata (keys are lower case on the wire)."""
    for key, value in metadata or ():
        if str(key).lower() == "authorization":
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


__all__ = [
    "CHALLENGE",
    "DIGEST_ENV",
    "OPEN_PATHS",
    "TOKEN_ENV",
    "UnauthorizedError",
    "bearer",
    "authorize",
    "digest",
    "digest_from_environment",
    "from_metadata",
    "is_open",
    "read_token",
]
