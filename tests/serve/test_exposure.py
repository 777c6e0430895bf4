"""Who may call a server `vitdeploy serve` starts or writes (vitdeploy/serve/exposure.py), decided per listening port
before anything starts: each decision of the policy, without a server. The command's one-line refusals:
test_auth.py, test_tls.py; the red team's cases: test_exposure_redteam.py; the sockets a real server opens:
test_ray_app_auth.py."""

from __future__ import annotations

import pytest

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.serve.auth import TOKEN_ENV
from vitdeploy.serve.exposure import RAY_AUTH_MODE_ENV, REPLICAS, Exposure, listeners, serve_token

TOKEN = "exposure-tests-serve-token-0123456789"
OPEN = "lets anyone who reaches the port call the model"
CLEAR = "would send the serve token in clear text over plain HTTP"
PLAIN = "serves plain HTTP to the network"
RS = "the RayService (0.0.0.0)"
LOCAL = {"the local Ray": False, REPLICAS: True}  # Ray Serve binds each replica's gRPC server on every interface


@pytest.fixture(autouse=True)
def ray_token_auth(monkeypatch):
    """A Ray of our own as Ray 2.60 starts one: with its token authentication (the tests' conftest turns it off)."""
    monkeypatch.delenv(RAY_AUTH_MODE_ENV, raising=False)


@pytest.mark.parametrize(
    "host, written, exposed",
    [
        ("127.0.0.1", {}, {"HTTP": False, **LOCAL}),
        ("localhost", {}, {"HTTP": False, **LOCAL}),
        ("::1", {}, {"HTTP": False, **LOCAL}),
        ("0.0.0.0", {}, {"HTTP": True, **LOCAL}),  # Ray stays on loopback (serve.metrics_host)
        ("10.1.2.3", {}, {"HTTP": True, **LOCAL}),
        ("127.0.0.1", {"address": "auto"}, {"HTTP": False}),  # a cluster joined: its Ray is its owner's
        ("127.0.0.1", {"write_config": True}, {"HTTP": False}),  # a Serve config runs where --host says
        ("127.0.0.1", {"write_rayservice": True}, {"HTTP": True}),  # a RayService's pods listen on 0.0.0.0
    ],
)
def test_exposed_means_bound_beyond_loopback(host, written, exposed):
    found = listeners(parse_config({}, None), Exposure(host, **written), token=False)
    assert {listener.what: listener.exposed for listener in found} == exposed


def test_the_grpc_proxy_binds_every_interface_whatever_the_host_and_has_no_tls():
    """Ray Serve 2.60's gRPCOptions has no host and no TLS: its proxy calls add_insecure_port("[::]:<port>")."""
    import inspect

    pytest.importorskip("ray.serve")
    from ray.serve._private import grpc_util
    from ray.serve.config import gRPCOptions

    assert not {"host", "ssl_certfile", "ssl_keyfile"} & set(gRPCOptions.model_fields)
    assert 'f"[::]:{grpc_options.port}"' in inspect.getsource(grpc_util.start_grpc_server)
    cfg = parse_config({"serve": {"grpc_port": 9001}}, None)
    grpc = next(x for x in listeners(cfg, Exposure("127.0.0.1"), token=True) if x.what == "gRPC")
    assert grpc.exposed and grpc.address == "[::]:9001" and grpc.token and not grpc.tls


def test_the_local_ray_leaves_loopback_only_when_host_and_metrics_host_both_do():
    cfg = parse_config({"serve": {"metrics_host": "10.1.2.3", "metrics_port": 8090}}, None)
    ray = {x.host for x in listeners(cfg, Exposure("127.0.0.1"), token=True) if x.what == "the local Ray"}
    assert ray == {"127.0.0.1"}
    ray = next(x for x in listeners(cfg, Exposure("0.0.0.0"), token=True) if x.what == "the local Ray")
    assert ray.exposed and ray.address == "0.0.0.0:8090" and not ray.token and not ray.tls  # Prometheus: neither


@pytest.mark.parametrize(
    "token, exposure, refusal",
    [
        # without a token: only loopback, or what the user allowed
        (None, Exposure("127.0.0.1"), None),
        (None, Exposure("127.0.0.1", write_config=True), None),
        (None, Exposure("0.0.0.0"), f"--host 0.0.0.0 {OPEN}"),
        (None, Exposure("0.0.0.0", allow_unauthenticated=True), f"--host 0.0.0.0 {PLAIN}"),
        (None, Exposure("0.0.0.0", allow_unauthenticated=True, allow_insecure=True), None),
        (None, Exposure("127.0.0.1", write_rayservice=True), f"{RS} {OPEN}"),
        (None, Exposure("127.0.0.1", write_config=True, write_rayservice=True), f"{RS} {OPEN}"),
        (None, Exposure("127.0.0.1", write_rayservice=True, allow_unauthenticated=True), f"{RS} {PLAIN}"),
        # with a token: never in clear text off loopback, unless an ingress terminates TLS
        (TOKEN, Exposure("127.0.0.1"), None),
        (TOKEN, Exposure("0.0.0.0"), f"--host 0.0.0.0 {CLEAR}"),
        (TOKEN, Exposure("0.0.0.0", allow_insecure=True), None),
        (TOKEN, Exposure("0.0.0.0", allow_unauthenticated=True), f"--host 0.0.0.0 {CLEAR}"),
        (TOKEN, Exposure("127.0.0.1", write_rayservice=True), f"{RS} {CLEAR}"),
        (TOKEN, Exposure("0.0.0.0", write_rayservice=True), f"{RS} {CLEAR}"),
        (TOKEN, Exposure("127.0.0.1", write_config=True, write_rayservice=True), f"{RS} {CLEAR}"),
        (TOKEN, Exposure("0.0.0.0", write_config=True, write_rayservice=True), f"--host 0.0.0.0 {CLEAR}"),
    ],
)
def test_each_decision_of_the_policy(monkeypatch, token, exposure, refusal):
    if token is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, token)
    cfg = parse_config({}, None)
    if refusal is None:
        assert serve_token(cfg, exposure) == token
        return
    with pytest.raises(ConfigError) as refused:
        serve_token(cfg, exposure)
    assert str(refused.value).startswith(refusal) and TOKEN not in str(refused.value)


def test_with_tls_the_token_may_travel_except_over_grpc(tmp_path, monkeypatch):
    pytest.importorskip("cryptography")
    from helpers.certs import make_certs

    make_certs(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    tls = {"certfile": "cert.pem", "keyfile": "key.pem"}
    https = parse_config({"serve": {"tls": tls}}, tmp_path / "pipeline.yaml")
    assert serve_token(https, Exposure("0.0.0.0")) == TOKEN
    assert serve_token(https, Exposure("127.0.0.1", write_rayservice=True)) == TOKEN
    grpc = parse_config({"serve": {"tls": tls, "grpc_port": 9001}}, tmp_path / "pipeline.yaml")
    for host in ("0.0.0.0", "127.0.0.1"):  # the gRPC proxy is on the network whatever --host says
        with pytest.raises(ConfigError, match=r"^serve.grpc_port 9001: Ray Serve's gRPC proxy listens on every"):
            serve_token(grpc, Exposure(host))
        assert serve_token(grpc, Exposure(host, allow_insecure=True)) == TOKEN
    assert serve_token(grpc, Exposure("127.0.0.1", write_config=True)) == TOKEN  # the written config has no gRPC
    missing = parse_config({"serve": {"tls": {"certfile": "cert.pem", "keyfile": "nope.pem"}}}, tmp_path / "p.yaml")
    with pytest.raises(ConfigError, match="serve.tls.keyfile: .*nope.pem is not a file"):
        serve_token(missing, Exposure("127.0.0.1"))  # the files are read even where no token travels


def test_the_replicas_on_every_interface_need_rays_token_and_no_tls_no_caller_of_ours_being_remote(monkeypatch):
    """Ray Serve 2.60 binds each replica's inter-deployment gRPC server to [::]:0 and unpickles what it gets: with
    Ray's token authentication off (RAY_AUTH_MODE=disabled) anyone who reaches it runs code in the replica."""
    import inspect

    pytest.importorskip("ray.serve")
    from ray.serve._private import replica

    assert 'add_port_to_grpc_server(self._server, "[::]:0")' in inspect.getsource(replica)
    cfg = parse_config({}, None)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    found = {x.what: x for x in listeners(cfg, Exposure("127.0.0.1"), token=False)}
    assert found[REPLICAS].exposed and found[REPLICAS].token and not found[REPLICAS].tls
    assert serve_token(cfg, Exposure("127.0.0.1")) is None  # Ray's token guards them; none of ours calls from afar
    monkeypatch.setenv(RAY_AUTH_MODE_ENV, "disabled")
    with pytest.raises(ConfigError, match=rf"^RAY_AUTH_MODE=disabled: {REPLICAS} listen on every interface"):
        serve_token(cfg, Exposure("127.0.0.1"))
    assert serve_token(cfg, Exposure("127.0.0.1", allow_unauthenticated=True)) is None
    assert serve_token(cfg, Exposure("127.0.0.1", address="auto")) is None  # a cluster's replicas are its owner's
