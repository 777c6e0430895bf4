"""The one HTTP client of every call vitdeploy makes to a server - the load generator's requests, `validate --url`,
what `vitdeploy rollout` asks, a server's statistics, tune's reloads of a tritonserver - built one way:

* the base URL (``http://host:port``, ``https://...``; a path after it is a prefix every route goes under);
* the bearer token as the commands read it (``VITDEPLOY_SERVE_TOKEN``, else ``serve.token_file``, never argv:
  serve/auth.py) sent as ``Authorization: Bearer <token>`` (gRPC: ``authorization`` metadata), never logged;
* HTTPS: the server's certificate verified against ``ca_bundle`` (a PEM file, as curl's ``--cacert``) when one is
  given, else against the system's trust store, which OpenSSL's ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
  (:data:`CA_BUNDLE_ENV`) replace, as for the standard library's clients. The environment's proxies and
  ``.netrc`` are not read: a server is reached directly;
* no ``Accept-Encoding``: an answer comes uncompressed, as the server would send it to any client (Triton
  compresses when asked, which would put its compression in a load test's figures).

httpx, imported when a client is opened (``pip install 'vitdeploy[client]'``). The gRPC client (tritonclient,
:func:`open_grpc`) takes the same token and, at a ``grpcs://`` URL, the same CA bundle.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any, Optional, Union

from ..base._deps import require
from ..base.errors import ConfigError, first_line

#: OpenSSL's own variable: the CA bundle the system's trust store is replaced by (no ``ca_bundle`` given)
CA_BUNDLE_ENV = "SSL_CERT_FILE"
TIMEOUT_S = 300.0
#: what an answer may be encoded with: only itself (httpx would ask for gzip, deflate, br, zstd)
IDENTITY = {"Accept-Encoding": "identity"}

CaBundle = Optional[Union[str, Path]]


def auth_headers(token: Optional[str], grpc: bool = False) -> dict[str, str]:
    """The bearer token's header, {} without a token (gRPC metadata keys are lower case: grpc refuses
    ``Authorization``)."""
    if not token:
        return {}
    return {("authorization" if grpc else "Authorization"): f"Bearer {token}"}


def tls_context(ca_bundle: CaBundle = None) -> ssl.SSLContext:
    """How a server's certificate is verified: against ``ca_bundle`` alone when given, else the system's trust
    store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` honoured by OpenSSL). One context per CA bundle and environment,
    shared by every client of this process (loading a trust store takes tens of ms: a load test opens dozens of
    connections). ConfigError naming the file when it is none, or holds no PEM certificate."""
    path = str(Path(ca_bundle).expanduser()) if ca_bundle else None
    key = (path, os.environ.get(CA_BUNDLE_ENV), os.environ.get("SSL_CERT_DIR"))
    if key not in _CONTEXTS:
        _CONTEXTS[key] = _new_context(path)
    return _CONTEXTS[key]


_CONTEXTS: dict[tuple[Optional[str], ...], ssl.SSLContext] = {}


def _new_context(path: Optional[str]) -> ssl.SSLContext:
    if path is None:
        return ssl.create_default_context()
    if not Path(path).is_file():
        raise ConfigError(f"CA bundle {path}: not a file; give the PEM file of the CA that signed the server's cert")
    try:
        return ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"CA bundle {path}: not a PEM CA bundle ({first_line(exc)})") from None


def open_http(url: str, token: Optional[str] = None, ca_bundle: CaBundle = None, timeout_s: float = TIMEOUT_S) -> Any:
    """An ``httpx.Client`` for the server at ``url`` (its routes relative to it), sending the token and verifying
    HTTPS as the module's docstring says; one keep-alive connection is reused across requests. Close it (or use
    it as a context manager)."""
    httpx = require("httpx", "a client of a running server (pip install 'vitdeploy[client]')")
    https = url.lower().startswith("https://")  # plain HTTP has no certificate to verify, no trust store to load
    return httpx.Client(
        base_url=url.rstrip("/"),
        headers={**IDENTITY, **auth_headers(token)},
        verify=tls_context(ca_bundle) if https else False,
        timeout=timeout_s,
        trust_env=False,
    )


def transport_errors() -> tuple[type[BaseException], ...]:
    """What a request raises when the server could not be reached or answered nothing readable (a refused
    connection, a certificate that does not verify, a timeout, a connection dropped mid-answer)."""
    import httpx

    return (httpx.TransportError, httpx.InvalidURL)


def open_grpc(url: str, ca_bundle: CaBundle = None, purpose: str = "--protocol v2-grpc") -> Any:
    """A ``tritonclient.grpc.InferenceServerClient`` for the server at ``url`` (``host:port``, ``grpc://`` or
    ``grpcs://``: TLS, verified against ``ca_bundle``, else gRPC's own roots). The token goes with each call, as
    :func:`auth_headers` ``(token, grpc=True)`` headers (tritonclient's API)."""
    grpc = require("tritonclient.grpc", f"{purpose} (pip install 'tritonclient[grpc]')")
    tls = (
        {"ssl": True, "root_certificates": str(ca_bundle) if ca_bundle else None} if url.startswith("grpcs://") else {}
    )
    return grpc.InferenceServerClient(url.split("://", 1)[-1].rstrip("/"), **tls)


__all__ = [
    "CA_BUNDLE_ENV",
    "IDENTITY",
    "TIMEOUT_S",
    "auth_headers",
    "open_grpc",
    "open_http",
    "tls_context",
    "transport_errors",
]
