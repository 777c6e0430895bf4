"""Who may call a server `vitdeploy serve` starts or writes (vitdeploy/serve/exposure.py), decided before anything
starts: each decision of the policy, without a server. The command's one-line refusals: test_auth.py,
test_tls.py."""

from __future__ import annotations

import pytest

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.serve.auth import TOKEN_ENV
from vitdeploy.serve.exposure import Exposure, serve_token

TOKEN = "exposure-tests-serve-token-0123456789"
OPEN = "lets anyone who reaches the port call the model"
CLEAR = "would send the serve token in clear text over plain HTTP"


@pytest.mark.parametrize(
    "host, written, exposed",
    [
        ("127.0.0.1", {}, False),
        ("localhost", {}, False),
        ("::1", {}, False),
        ("0.0.0.0", {}, True),
        ("10.1.2.3", {}, True),
        ("127.0.0.1", {"write_config": True}, False),  # a Serve config runs where --host says
        ("127.0.0.1", {"write_rayservice": True}, True),  # a RayService's pods listen on 0.0.0.0
    ],
)
def test_exposed_means_reachable_from_another_machine(host, written, exposed):
    assert Exposure(host, **written).exposed is exposed


@pytest.mark.parametrize(
    "token, exposure, refusal",
    [
        # without a token: only loopback, or what the user allowed
        (None, Exposure("127.0.0.1"), None),
        (None, Exposure("127.0.0.1", write_config=True), None),
        (None, Exposure("0.0.0.0"), f"--host 0.0.0.0 {OPEN}"),
        (None, Exposure("0.0.0.0", allow_unauthenticated=True), None),
        (None, Exposure("127.0.0.1", write_rayservice=True), f"the RayService (0.0.0.0) {OPEN}"),
        (None, Exposure("127.0.0.1", write_config=True, write_rayservice=True), f"--host 127.0.0.1 {OPEN}"),
        (None, Exposure("127.0.0.1", write_rayservice=True, allow_unauthenticated=True), None),
        # with a token: never in clear text off loopback, unless an ingress terminates TLS
        (TOKEN, Exposure("127.0.0.1"), None),
        (TOKEN, Exposure("0.0.0.0"), f"--host 0.0.0.0 {CLEAR}"),
        (TOKEN, Exposure("0.0.0.0", allow_insecure=True), None),
        (TOKEN, Exposure("0.0.0.0", allow_unauthenticated=True), f"--host 0.0.0.0 {CLEAR}"),
        (TOKEN, Exposure("127.0.0.1", write_rayservice=True), f"the RayService (0.0.0.0) {CLEAR}"),
        (TOKEN, Exposure("0.0.0.0", write_rayservice=True), f"--host 0.0.0.0 {CLEAR}"),
        (TOKEN, Exposure("127.0.0.1", write_config=True, write_rayservice=True), f"the RayService (0.0.0.0) {CLEAR}"),
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
    with pytest.raises(ConfigError, match=r"^--host 0.0.0.0: gRPC \(serve.grpc_port\) has no TLS"):
        serve_token(grpc, Exposure("0.0.0.0"))
    assert serve_token(grpc, Exposure("0.0.0.0", allow_insecure=True)) == TOKEN
    missing = parse_config({"serve": {"tls": {"certfile": "cert.pem", "keyfile": "nope.pem"}}}, tmp_path / "p.yaml")
    with pytest.raises(ConfigError, match="serve.tls.keyfile: .*nope.pem is not a file"):
        serve_token(missing, Exposure("127.0.0.1"))  # the files are read even where no token travels
