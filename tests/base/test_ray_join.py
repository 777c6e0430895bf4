"""How every process of ours joins Ray (vitdeploy/base/ray_join.py): token authentication turned on when joining by
address a cluster that wants it, with a token available where Ray 2.60 reads one; an explicit RAY_AUTH_MODE left
alone; the token file written whole once; and a two-node cluster started with authentication disabled still joined
with Ray's defaults (an object of the joining process fetched on the other node; `vitdeploy rollout --status`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

import pytest

from vitdeploy.base import ray_join, ray_loopback
from vitdeploy.base.errors import BackendError
from vitdeploy.base.ray_join import (
    AUTH_MODE_ENV,
    cluster_wants_token,
    ensure_local_token,
    init_ray,
    token_source,
    use_cluster_token,
)
from vitdeploy.base.ray_private import local_ray_options

#: Ray keeps what these tests switch (its token and auth mode) for the rest of the process: a Ray started
#: in-process afterwards fails to reach its own GCS (seen in the parallel phase). `make test` runs them alone.
pytestmark = pytest.mark.isolated


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user without any Ray token: HOME elsewhere, no token variables, no mode, Ray's configuration refresh
    recorded instead of done (this process's own Ray configuration is left as it was)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (AUTH_MODE_ENV, "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", ray_loopback.RAY_CLUSTER_ENV):
        monkeypatch.delenv(name, raising=False)
    constants = sys.modules.get("ray._private.ray_constants")  # Ray's switch as read at its import, restored after
    if constants is not None:
        monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", constants.ENABLE_RAY_CLUSTER)
    # recorded where vitdeploy calls it, never by faking a Ray module: a Ray module imported meanwhile would keep
    # the fake for good (Ray's own token switch then never reaches its configuration: a later Ray start fails)
    refreshed: list[str] = []
    monkeypatch.setattr(ray_join, "refresh_ray_config", lambda: refreshed.append("") or True)
    return tmp_path, refreshed


def test_a_token_is_found_where_ray_reads_one_in_its_order(home, monkeypatch):
    folder, _ = home
    assert token_source() is None
    (folder / ".ray").mkdir()
    (folder / ".ray" / "auth_token").write_text("abc\n")
    assert token_source() == str(folder / ".ray" / "auth_token")
    named = folder / "elsewhere"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(named))
    assert token_source() is None  # a path named and empty: Ray reads that one, not ~/.ray's
    named.write_text("def")
    assert token_source().startswith("RAY_AUTH_TOKEN_PATH")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ghi")
    assert token_source() == "RAY_AUTH_TOKEN"


def test_joining_by_address_turns_token_auth_on_only_with_a_token_and_no_mode_set(home, monkeypatch):
    folder, refreshed = home
    assert not use_cluster_token() and AUTH_MODE_ENV not in os.environ  # no token: as Ray would
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    assert use_cluster_token() and os.environ[AUTH_MODE_ENV] == "token" and refreshed == [""]
    monkeypatch.setenv(AUTH_MODE_ENV, "disabled")  # the user's choice stays
    assert not use_cluster_token() and os.environ[AUTH_MODE_ENV] == "disabled" and len(refreshed) == 1


def test_init_ray_authenticates_a_join_and_makes_the_token_of_a_ray_of_its_own(home, monkeypatch):
    folder, _ = home
    asked = []
    monkeypatch.setattr(ray_join, "cluster_wants_token", lambda address: asked.append(address) or True)
    calls = []
    fake_ray = types.SimpleNamespace(init=lambda **kw: calls.append((kw, os.environ.get(AUTH_MODE_ENV))) or "ctx")
    assert init_ray(fake_ray, "127.0.0.1:6379", logging_level="WARNING") == "ctx"
    assert calls[-1] == ({"address": "127.0.0.1:6379", "logging_level": "WARNING"}, None)  # no token yet
    init_ray(fake_ray, "local", num_cpus=1)
    token = (folder / ".ray" / "auth_token").read_text()
    assert len(token) == 64 and (folder / ".ray" / "auth_token").stat().st_mode & 0o077 == 0
    init_ray(fake_ray, "127.0.0.1:6379")
    assert calls[-1][1] == "token" and asked == ["127.0.0.1:6379"]  # asked only once a token was there


def _node(ip: str, shutdowns: list) -> types.SimpleNamespace:
    """A ray.init whose node took ``ip``, recording the loopback switch it found and each shutdown."""
    found = []

    def init(**kw):
        found.append((kw, os.environ.get(ray_loopback.RAY_CLUSTER_ENV)))
        return types.SimpleNamespace(address_info={"node_ip_address": ip})

    return types.SimpleNamespace(init=init, shutdown=lambda: shutdowns.append(1), found=found)


def test_init_ray_joins_a_loopback_address_on_loopback_and_a_network_one_as_ray_would(home, monkeypatch):
    monkeypatch.setattr(ray_join, "cluster_wants_token", lambda address: False)
    ray = _node("10.0.0.5", [])
    init_ray(ray, "10.0.0.5:6379")
    assert ray.found[-1][1] is None  # Ray's own rule: its node address
    init_ray(ray, "127.0.0.1:6379")
    assert ray.found[-1][1] == "0"  # looked for on loopback, where a `vitdeploy serve` on loopback has its Ray


def test_a_ray_of_our_own_asked_on_loopback_stays_there_or_is_stopped(home):
    shutdowns: list = []
    ray = _node("127.0.0.1", shutdowns)
    init_ray(ray, "local", **local_ray_options(None, loopback=False))
    assert ray.found[-1][1] is None and not shutdowns  # not asked on loopback: Ray's node address, unchecked
    init_ray(ray, "local", num_cpus=1, **local_ray_options(None, loopback=True))
    assert ray.found[-1][1] == "0" and not shutdowns
    swapped = _node("192.0.2.2", shutdowns)  # a Ray that ignores the switch
    with pytest.raises(BackendError, match="took the address 192.0.2.2 instead of 127.0.0.1"):
        init_ray(swapped, None, **local_ray_options(None, loopback=True))
    assert shutdowns == [1]  # stopped before its ports stay open on the network


def test_a_cluster_with_token_auth_off_is_joined_without_one(home, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    monkeypatch.setattr(ray_join, "cluster_wants_token", lambda address: False)
    assert not use_cluster_token("127.0.0.1:6379") and AUTH_MODE_ENV not in os.environ
    monkeypatch.setattr(ray_join, "cluster_wants_token", lambda address: None)  # cannot tell: the token goes
    assert use_cluster_token("127.0.0.1:6379") and os.environ[AUTH_MODE_ENV] == "token"


def test_nothing_answering_at_the_address_cannot_say():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused at once
        assert cluster_wants_token(f"127.0.0.1:{port}") is None


def test_the_token_file_is_written_whole_once_whoever_starts_first(home, monkeypatch):
    folder, _ = home
    writes = []
    link = os.link

    def slow_link(src, dst):  # every starter has its own token ready before any of them links it
        writes.append(Path(src).read_text())
        barrier.wait()
        return link(src, dst)

    barrier = threading.Barrier(4)
    monkeypatch.setattr(ray_join.os, "link", slow_link)
    threads = [threading.Thread(target=ensure_local_token) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = (folder / ".ray" / "auth_token").read_text()
    assert len(set(writes)) == 4 and kept in writes
    assert sorted(p.name for p in (folder / ".ray").iterdir()) == ["auth_token"]  # no temporary file left
    ensure_local_token()
    assert (folder / ".ray" / "auth_token").read_text() == kept


START = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=1, resources={"second": 1})
cluster.wait_for_nodes()
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""
JOIN = """
import sys, ray
from vitdeploy.base.ray_join import init_ray
init_ray(ray, sys.argv[1], logging_level="ERROR")
owned = ray.put(list(range(100_000)))  # fetched from this process by a worker of the other node

@ray.remote(resources={"second": 1})
def size(refs):
    return len(ray.get(refs[0]))

print(ray.get(size.remote([owned]), timeout=120))
"""


@pytest.mark.integration
@pytest.mark.slow
def test_a_two_node_cluster_started_with_auth_disabled_is_still_joined_with_rays_defaults():
    pytest.importorskip("ray")
    assert token_source() is not None  # tests/conftest.py made the user's token: a join must not turn it on here
    ray_tmp = tempfile.mkdtemp(prefix="vdauth", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop(AUTH_MODE_ENV, None)
    head = subprocess.Popen(
        [sys.executable, "-c", START],
        env={**env, AUTH_MODE_ENV: "disabled"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        gcs = head.stdout.readline().strip()  # type: ignore[union-attr]
        assert gcs, "the disabled cluster did not start"
        res = subprocess.run([sys.executable, "-c", JOIN, gcs], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and res.stdout.strip() == "100000", res.stderr[-2000:]
        cmd = [sys.executable, "-m", "vitdeploy.cli", "rollout", "--status", "--address", gcs]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0 and res.stdout.strip() == "no rollout yet", res.stderr[-2000:]
    finally:
        head.communicate("", timeout=120)
        shutil.rmtree(ray_tmp, ignore_errors=True)
