"""HTTPS settings without a server (serve/tls.py): the certificate checked before Ray starts, the refusal to send
a token in clear text on a network host, and what --write-config / --write-rayservice carry. The real HTTPS
server (httpx, curl, tritonclient verifying a certificate the test makes): test_ray_app_auth.py."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from helpers.certs import make_certs

from vitdeploy.base.config import load_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.cli import main
from vitdeploy.serve import tls
from vitdeploy.serve.auth import TOKEN_ENV

pytest.importorskip("cryptography")
TOKEN = "tls-tests-serve-token-0123456789"


@pytest.fixture()
def certs(tmp_path):
    return make_certs(tmp_path)


def _pipeline(folder, serve: str) -> str:
    path = folder / "pipeline.yaml"
    path.write_text(f"serve: {{{serve}}}\n")
    return str(path)


def _cli(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_the_certificate_and_key_are_read_before_anything_starts(certs, tmp_path):
    cfg = load_config(_pipeline(tmp_path, "tls: {certfile: cert.pem, keyfile: key.pem, ca_certs: ca.pem}"))
    files = tls.check_files(cfg)
    assert files == {"certfile": str(certs.cert), "keyfile": str(certs.key), "ca_certs": str(certs.ca)}
    assert tls.http_options(cfg) == {
        "ssl_certfile": str(certs.cert),
        "ssl_keyfile": str(certs.key),
        "ssl_ca_certs": str(certs.ca),
    }
    with pytest.raises(ConfigError, match="serve.tls.keyfile: .*missing.pem is not a file"):
        tls.check_files(load_config(_pipeline(tmp_path, "tls: {certfile: cert.pem, keyfile: missing.pem}")))
    (tmp_path / "other").mkdir()
    other = make_certs(tmp_path / "other")
    mismatched = _pipeline(tmp_path, f"tls: {{certfile: cert.pem, keyfile: {other.key}}}")
    with pytest.raises(ConfigError, match="serve.tls: cannot use") as wrong:
        tls.check_files(load_config(mismatched))
    assert other.key_text.splitlines()[1] not in str(wrong.value)


def test_a_token_in_clear_text_on_a_network_host_is_refused_in_one_line(certs, tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    plain = _pipeline(tmp_path, "port: 8000")
    res = _cli(["serve", "-a", str(tmp_path / "none"), "-c", plain, "--host", "0.0.0.0"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "serve.tls" in lines[0] and "TLS-terminating ingress" in lines[0] and "--allow-insecure" in lines[0]
    assert TOKEN not in res.output
    # gRPC has no TLS in Ray Serve: with serve.tls it is still clear text
    grpc = _pipeline(tmp_path, "grpc_port: 9001, tls: {certfile: cert.pem, keyfile: key.pem}")
    res = _cli(["serve", "-a", str(tmp_path / "none"), "-c", grpc, "--host", "0.0.0.0"])
    assert res.exit_code == 2 and "serve.grpc_port" in res.output and "ingress" in res.output, res.output
    # behind an ingress the user says so; loopback and tokenless servers are not concerned
    cfg = load_config(plain)
    tls.check_transport(cfg, "0.0.0.0", True, True, allow_insecure=True)
    tls.check_transport(cfg, "127.0.0.1", False, True, allow_insecure=False)
    tls.check_transport(cfg, "0.0.0.0", True, False, allow_insecure=False)


def test_written_configs_carry_tls_paths_and_the_rayservice_a_secret_never_the_key(
    certs, tmp_path, monkeypatch, tiny_artifacts
):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    pipeline = _pipeline(tmp_path, "tls: {certfile: cert.pem, keyfile: key.pem, ca_certs: ca.pem}")
    config, kube = tmp_path / "serve.yaml", tmp_path / "rs.yaml"
    args = ["serve", "-a", str(tiny_artifacts()), "-c", pipeline, "--write-config", str(config)]
    res = _cli([*args, "--write-rayservice", str(kube)])
    assert res.exit_code == 0, res.output
    options = yaml.safe_load(config.read_text())["http_options"]
    assert options["ssl_certfile"] == str(certs.cert) and options["ssl_keyfile"] == str(certs.key)
    assert options["ssl_ca_certs"] == str(certs.ca)
    doc = yaml.safe_load(kube.read_text())
    served = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert served["http_options"]["ssl_keyfile"] == f"{tls.MOUNT}/tls.key"
    assert served["applications"][0]["args"]["pipeline"]["serve"]["tls"] is None
    cluster = doc["spec"]["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        pod = group["template"]["spec"]
        assert pod["volumes"][0]["secret"]["secretName"].endswith("-serve-tls")
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == tls.MOUNT
    assert "kubectl create secret generic" in kube.read_text()
    key = "".join(certs.key_text.splitlines()[1:-1])
    for path in (config, kube):
        text = path.read_text()
        assert key not in text.replace("\n", "") and TOKEN not in text, path
    # without serve.tls a RayService with a token is refused unless an ingress terminates TLS
    res = _cli(["serve", "-a", str(tiny_artifacts()), "--write-rayservice", str(kube)])
    assert res.exit_code == 2 and "the RayService (0.0.0.0)" in res.output and "serve.tls" in res.output
