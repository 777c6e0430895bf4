"""Who may call the server `vitdeploy serve` starts (or writes a config for), decided per listening port before
anything starts.

:func:`listeners` names every port the server opens and the address it really binds:

* the HTTP proxy: ``--host`` (a RayService: 0.0.0.0, whatever ``--host`` says);
* the gRPC proxy (``serve.grpc_port``): Ray Serve 2.60 binds it to every interface (``[::]``) whatever ``--host``
  says, and serves it without TLS (its gRPCOptions has neither a host nor TLS; ``grpc_util.start_grpc_server`` calls
  ``add_insecure_port("[::]:<port>")``): it is always exposed, never encrypted;
* the local Ray (``vitdeploy serve`` without ``--address``): its GCS, raylet, workers and Prometheus metrics
  (``serve.metrics_port``) on 127.0.0.1 (base/ray_loopback.py), unless both ``--host`` and
  ``serve.metrics_host`` are network addresses; its metrics port has no token and no TLS;
* the local Ray's Serve replicas: each one's inter-deployment gRPC server, which Ray Serve 2.60 binds to every
  interface on a port of its own (``replica.py``: ``add_port_to_grpc_server(server, "[::]:0")``) and which unpickles
  what it is sent: guarded by Ray's token authentication (on unless ``RAY_AUTH_MODE`` says otherwise), TLS only with
  ``RAY_USE_TLS``. No caller of ours reaches it from another machine (the proxy calls it over loopback), so only
  its token is required. On a cluster joined with ``--address`` both are its owner's (Ray's token, Ray's TLS).

A port beyond loopback (exposed) needs a serve token (``VITDEPLOY_SERVE_TOKEN`` or ``serve.token_file``) unless
``--allow-unauthenticated``, and TLS (``serve.tls``) unless ``--allow-insecure`` (a TLS-terminating ingress or load
balancer in front, or a network only trusted machines reach). ``serve.tls``'s files are read first. Each refusal is
a ConfigError: one line naming the port and the option that opened it, exit 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ..base.errors import ConfigError
from ..base.ray_loopback import LOOPBACK
from . import tls
from .auth import read_token

#: How a refusal names a RayService: it listens on every address, whatever --host says.
RAYSERVICE = "the RayService (0.0.0.0)"
EVERY_INTERFACE = "0.0.0.0"
#: Where Ray Serve 2.60's gRPC proxy listens, whatever --host says; it has no TLS either.
GRPC_BIND = "[::]"
GRPC_WHY = "Ray Serve's gRPC proxy listens on every interface whatever --host says, and has no TLS"
#: Ray's token authentication: on for a Ray of our own unless this says another mode than "token"
#: (ray/_private/authentication/authentication_token_setup.py: enable_token_auth_by_default)
RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"
RAY_TLS_ENV = "RAY_USE_TLS"
REPLICAS = "Ray Serve's replicas"
MAKE_TOKEN = "set VITDEPLOY_SERVE_TOKEN (or serve.token_file) to require a token"
TLS_FRONT = "when a TLS-terminating ingress or load balancer is in front"


@dataclass(frozen=True)
class Exposure:
    """What `serve` was asked for: the host and port it listens on, the files it writes instead, the cluster it
    joins (``address``: not a Ray of its own), what the user allowed."""

    host: str
    write_config: bool = False
    write_rayservice: bool = False
    allow_unauthenticated: bool = False
    allow_insecure: bool = False
    port: Optional[int] = None  # None: serve.port
    address: Optional[str] = None

    @property
    def writes(self) -> bool:
        return self.write_config or self.write_rayservice


@dataclass(frozen=True)
class Listener:
    """One port the server opens: what it is, the option that opened it (``where``), the address it binds, and
    whether a caller there needs the serve token and speaks TLS."""

    what: str  # "HTTP", "gRPC", "the local Ray", REPLICAS
    where: str  # what a refusal names: "--host 0.0.0.0", "serve.grpc_port 9001", RAYSERVICE ...
    host: str
    port: int  # 0: a port each (Ray Serve's replicas)
    token: bool
    tls: bool
    remote_callers: bool = True  # False: no caller of ours reaches it from another machine, so none needs TLS

    @property
    def exposed(self) -> bool:
        """Reachable from other machines: bound to an address that is not loopback."""
        return self.host.strip("[]") not in LOOPBACK

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port or '<a port each>'}"

    def shown(self) -> str:
        """The address it binds and who may reach it, as the startup lines say it."""
        if not self.exposed:
            return f"{self.address}, this machine only"
        reach = "every interface" if self.host in (EVERY_INTERFACE, GRPC_BIND) else "the network"
        return f"{self.address}, {reach}: {'a token' if self.token else 'no token'}, {'TLS' if self.tls else 'no TLS'}"


def ray_node_host(host: str, metrics_host: str) -> str:
    """Where the local Ray's ports listen: loopback unless both ``--host`` and ``serve.metrics_host`` are network
    addresses (then other machines may join it with --address, and read its metrics)."""
    return "127.0.0.1" if host in LOOPBACK or metrics_host in LOOPBACK else EVERY_INTERFACE


def listeners(cfg: Any, exposure: Exposure, token: bool) -> list[Listener]:
    """Every port the server opens (or the written config or RayService opens), with its real bind address."""
    sv = cfg.serve
    https = sv.tls is not None
    port = exposure.port or sv.port
    found = []
    if exposure.write_config or not exposure.write_rayservice:  # this server, or a Serve config: --host
        found.append(Listener("HTTP", f"--host {exposure.host}", exposure.host, port, token, https))
    if exposure.write_rayservice:
        found.append(Listener("HTTP", RAYSERVICE, EVERY_INTERFACE, port, token, https))
    if exposure.writes:  # the written files serve no gRPC, and the Ray nodes are the cluster's
        return found
    if sv.grpc_port is not None:
        found.append(Listener("gRPC", f"serve.grpc_port {sv.grpc_port}", GRPC_BIND, sv.grpc_port, token, False))
    if exposure.address is None:
        node = ray_node_host(exposure.host, sv.metrics_host)
        where = f"serve.metrics_host {sv.metrics_host}"
        found.append(Listener("the local Ray", where, node, sv.metrics_port, False, False))
        mode = os.environ.get(RAY_AUTH_MODE_ENV)
        tls_on = os.environ.get(RAY_TLS_ENV, "0").strip().lower() in ("1", "true")
        where = f"{RAY_AUTH_MODE_ENV}={mode}"
        found.append(Listener(REPLICAS, where, GRPC_BIND, 0, ray_token_auth(), tls_on, remote_callers=False))
    return found


def ray_token_auth() -> bool:
    """Whether a Ray of our own requires its cluster token on every gRPC server (the replicas' among them)."""
    mode = os.environ.get(RAY_AUTH_MODE_ENV)
    return mode is None or mode.strip().lower() == "token"


def _refusals(listener: Listener) -> tuple[str, str]:
    """Why ``listener`` may not open without a token (unless --allow-unauthenticated), and without TLS (unless
    --allow-insecure)."""
    token = listener.token
    at = listener.address
    if listener.what == "gRPC":
        return (
            f"{listener.where}: {GRPC_WHY} ({at}), so anyone who reaches it could call the model: {MAKE_TOKEN}, "
            f"unset serve.grpc_port, or pass --allow-unauthenticated",
            f"{listener.where}: {GRPC_WHY} ({at}), so "
            + ("the serve token" if token else "every request")
            + f" would travel in clear text: unset serve.grpc_port, or pass --allow-insecure {TLS_FRONT}",
        )
    if listener.what == REPLICAS:
        replicas = (
            f"{listener.where}: {REPLICAS} listen on every interface ({listener.address}, whatever --host says) for "
            f"inter-deployment calls, which without Ray's token authentication anyone who reaches them may make "
            f"(what they send is unpickled: code run in the replica)"
        )
        fix = (
            f"{replicas}: unset {RAY_AUTH_MODE_ENV} (Ray then requires its cluster token), or pass "
            f"--allow-unauthenticated when only machines you trust reach this one"
        )
        return fix, fix  # no TLS asked: only this machine's proxy calls them, over loopback
    if listener.what == "the local Ray":
        ray = (
            f"{listener.where} with --host on the network puts the local Ray's ports on every interface (its GCS, "
            f"raylet, workers, and Prometheus metrics on port {listener.port}, which has no token and no TLS)"
        )
        fix = "keep serve.metrics_host on 127.0.0.1 (the metrics then stay on this machine), or pass"
        return (f"{ray}: {fix} --allow-unauthenticated", f"{ray}: {fix} --allow-insecure")
    https = "set serve.tls.certfile and serve.tls.keyfile to serve HTTPS"
    clear = (
        "would send the serve token in clear text over plain HTTP"
        if token
        else "serves plain HTTP to the network (every request and answer readable on the way)"
    )
    return (
        f"{listener.where} lets anyone who reaches the port call the model: {MAKE_TOKEN}, or pass "
        f"--allow-unauthenticated",
        f"{listener.where} {clear}: {https}, or pass --allow-insecure {TLS_FRONT}",
    )


def check_listeners(found: list[Listener], allow_unauthenticated: bool, allow_insecure: bool) -> None:
    """ConfigError (one line) for the first exposed port without a token (unless ``allow_unauthenticated``) or
    without TLS (unless ``allow_insecure``)."""
    for listener in found:
        if not listener.exposed:
            continue
        no_token, no_tls = _refusals(listener)
        if not listener.token and not allow_unauthenticated:
            raise ConfigError(no_token)
        if not listener.tls and listener.remote_callers and not allow_insecure:
            raise ConfigError(no_tls)


def serve_token(cfg: Any, exposure: Exposure) -> str | None:
    """The serve token (None: none set), once the policy allows serving as asked; ConfigError otherwise."""
    token = read_token(cfg.resolve(cfg.serve.token_file) if cfg.serve.token_file else None)
    tls.check_files(cfg)
    found = listeners(cfg, exposure, token is not None)
    check_listeners(found, exposure.allow_unauthenticated, exposure.allow_insecure)
    return token


__all__ = [
    "EVERY_INTERFACE",
    "Exposure",
    "GRPC_BIND",
    "Listener",
    "RAYSERVICE",
    "REPLICAS",
    "check_listeners",
    "listeners",
    "ray_node_host",
    "ray_token_auth",
    "serve_token",
]
