"""A Ray of our own on loopback, really, and joining one.

Ray 2.60 swaps a loopback node address for the machine's (``services.resolve_ip_for_localhost``: ``ray.init``'s
``_node_ip_address="127.0.0.1"`` and a joiner's ``address="127.0.0.1:port"`` alike), and its GCS, raylet, agents and
metrics then listen on every interface. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it keeps 127.0.0.1 (as it does
on macOS and Windows), and every one of its gRPC servers listens on loopback only. So:

* :func:`keep_on_loopback` before a Ray of our own starts on loopback, and before a process joins a cluster by a
  loopback address (:func:`for_address`): a joiner without it would look for the cluster at the machine's address,
  where nothing listens;
* :func:`check_node` after the start: a node that took another address anyway is refused.

base/ray_join.init_ray calls them: :func:`for_address` before every join, :func:`keep_on_loopback` and
:func:`check_node` around a start of our own asked on 127.0.0.1. Ray reads the variable when it is imported; where
it already was, its module constant is set too (both private in Ray 2.60: base/ray_private.py). No Ray import here.
"""

from __future__ import annotations

import os
from typing import Optional

from .errors import BackendError
from .ray_private import CLUSTER_ENABLED, CLUSTER_ENV, set_imported

LOOPBACK = ("127.0.0.1", "localhost", "::1")
RAY_CLUSTER_ENV = CLUSTER_ENV.variable


def keep_on_loopback() -> None:
    """Every port of the Ray this process starts (or joins by a loopback address) on 127.0.0.1."""
    os.environ[RAY_CLUSTER_ENV] = "0"
    set_imported(CLUSTER_ENABLED, False)


def address_host(address: str) -> str:
    """The host of a Ray address: ``host:port``, ``ray://host:port``, ``[::1]:port``."""
    rest = address.split("://", 1)[-1].rstrip("/")
    if rest.startswith("["):
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0] if rest.count(":") == 1 else rest


def for_address(address: Optional[str]) -> None:
    """Before ``ray.init(address=...)`` joins a cluster: a loopback address keeps this process on loopback."""
    if address and address not in ("auto", "local") and address_host(address) in LOOPBACK:
        keep_on_loopback()


def check_node(node_ip: str) -> None:
    """BackendError when the Ray started for loopback took a network address (its ports would be on the network)."""
    if node_ip.strip("[]") not in LOOPBACK:
        raise BackendError(
            f"the local Ray took the address {node_ip} instead of 127.0.0.1, so its ports would listen on the "
            f"network; this Ray ignores {RAY_CLUSTER_ENV}=0: stopped"
        )


__all__ = ["LOOPBACK", "RAY_CLUSTER_ENV", "address_host", "check_node", "for_address", "keep_on_loopback"]
