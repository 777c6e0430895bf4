"""A Ray of our own really on loopback (vitdeploy/base/ray_loopback.py): Ray 2.60 swaps a loopback node address for
the machine's and then listens on every interface, unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0; a process joining a
cluster by a loopback address needs it too. The sockets a real server opens: tests/serve/test_ray_app_auth.py."""

from __future__ import annotations

import os

import pytest

from vitdeploy.base import ray_loopback
from vitdeploy.base.errors import BackendError


@pytest.fixture()
def ray_constants(monkeypatch):
    monkeypatch.delenv(ray_loopback.RAY_CLUSTER_ENV, raising=False)
    constants = pytest.importorskip("ray._private.ray_constants")
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)  # Linux's default, read by Ray at import
    return constants


def test_without_it_ray_swaps_loopback_for_the_machines_address_with_it_keeps_loopback(ray_constants):
    from ray._private import services

    machine = services.resolve_ip_for_localhost("127.0.0.1")
    ray_loopback.keep_on_loopback()
    assert os.environ[ray_loopback.RAY_CLUSTER_ENV] == "0" and ray_constants.ENABLE_RAY_CLUSTER is False
    assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert machine  # on a machine with a network address it was that one (nothing to assert without one)


@pytest.mark.parametrize(
    "address, kept",
    [
        ("127.0.0.1:6379", True),
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("ray://127.0.0.1:10001", True),
        ("10.0.0.5:6379", False),
        ("ray://head:10001", False),
        ("auto", False),
        (None, False),
    ],
)
def test_a_joiner_keeps_loopback_only_for_a_loopback_address(ray_constants, address, kept):
    ray_loopback.for_address(address)
    assert (os.environ.get(ray_loopback.RAY_CLUSTER_ENV) == "0") is kept
    assert ray_constants.ENABLE_RAY_CLUSTER is not kept


def test_a_node_that_took_a_network_address_is_refused():
    ray_loopback.check_node("127.0.0.1")
    with pytest.raises(BackendError, match="took the address 192.0.2.2 instead of 127.0.0.1"):
        ray_loopback.check_node("192.0.2.2")
