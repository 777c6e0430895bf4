"""HTTPS settings without a server (serve/tls.py): the certificate checked before Ray starts, serve.tls.ca_certs
refused (Ray's proxy cannot require client certificates), the refusal to send a token in clear text on a network
host, what --write-config / --write-rayservice carry, and the RayService's Secret readable by the Ray container's
user. The real HTTPS server (httpx, curl, tritonclient verifying a certificate the test makes):
test_ray_app_auth.py."""

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


@pytest.fixture(autouse=True)
def ray_token_auth(monkeypatch):
    """A Ray of our own as Ray 2.60 starts one, with its token authentication (the tests' conftest turns it off):
    its replicas' gRPC servers are then no refusal of their own (test_exposure.py)."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)


def _pipeline(folder, serve: str) -> str:
    path = folder / "pipeline.yaml"
    path.write_text(f"serve: {{{serve}}}\n")
    return str(path)


def _cli(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_the_certificate_and_key_are_read_before_anything_starts(certs, tmp_path):
    cfg = load_config(_pipeline(tmp_path, "tls: {certfile: cert.pem, keyfile: key.pem}"))
    files = tls.check_files(cfg)
    assert files == {"certfile": str(certs.cert), "keyfile": str(certs.key)}
    assert tls.http_options(cfg) == {"ssl_certfile": str(certs.cert), "ssl_keyfile": str(certs.key)}
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
    # behind an ingress the user says so
    res = _cli(["serve", "-a", str(tmp_path / "none"), "-c", plain, "--host", "0.0.0.0", "--allow-insecure"])
    assert "does not exist" in res.output and "serve.tls" not in res.output, res.output  # past the policy


def test_client_certificates_cannot_be_required_so_ca_certs_is_refused_naming_the_key(certs, tmp_path):
    """Ray Serve 2.60's HTTPOptions passes ssl_ca_certs to uvicorn but no ssl_cert_reqs (uvicorn's default: no
    client certificate asked): a ca_certs that did nothing is refused, in one line, by the CLI too."""
    import inspect

    from ray.serve._private import http_util
    from ray.serve.config import HTTPOptions

    assert "ssl_cert_reqs" not in HTTPOptions.model_fields  # what would let us ask for one
    assert "ssl_cert_reqs" not in inspect.getsource(http_util)  # nor does the proxy pass uvicorn one
    pipeline = _pipeline(tmp_path, "tls: {certfile: cert.pem, keyfile: key.pem, ca_certs: ca.pem}")
    with pytest.raises(ConfigError, match=r"^serve\.tls\.ca_certs: Ray Serve's proxy cannot require client"):
        load_config(pipeline)
    res = _cli(["serve", "-a", str(tmp_path / "none"), "-c", pipeline])
    assert res.exit_code == 2 and res.output.startswith("error: serve.tls.ca_certs: "), res.output


def test_written_configs_carry_tls_paths_and_the_rayservice_a_secret_never_the_key(
    certs, tmp_path, monkeypatch, tiny_artifacts
):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    pipeline = _pipeline(tmp_path, "tls: {certfile: cert.pem, keyfile: key.pem}")
    config, kube = tmp_path / "serve.yaml", tmp_path / "rs.yaml"
    args = ["serve", "-a", str(tiny_artifacts()), "-c", pipeline, "--write-config", str(config)]
    res = _cli([*args, "--write-rayservice", str(kube)])
    assert res.exit_code == 0, res.output
    options = yaml.safe_load(config.read_text())["http_options"]
    assert options["ssl_certfile"] == str(certs.cert) and options["ssl_keyfile"] == str(certs.key)
    doc = yaml.safe_load(kube.read_text())
    served = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert served["http_options"]["ssl_keyfile"] == f"{tls.MOUNT}/tls.key"
    assert served["applications"][0]["args"]["pipeline"]["serve"]["tls"] is None
    cluster = doc["spec"]["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        pod = group["template"]["spec"]
        assert pod["volumes"][0]["secret"]["secretName"].endswith("-serve-tls")
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == tls.MOUNT
    assert (
        f"kubectl create secret tls {tls.secret_name('tiny')} --cert={certs.cert} --key={certs.key}"
        in kube.read_text()
    )
    key = "".join(certs.key_text.splitlines()[1:-1])
    for path in (config, kube):
        text = path.read_text()
        assert key not in text.replace("\n", "") and TOKEN not in text, path
    # without serve.tls a RayService with a token is refused unless an ingress terminates TLS
    res = _cli(["serve", "-a", str(tiny_artifacts()), "--write-rayservice", str(kube)])
    assert res.exit_code == 2 and "the RayService (0.0.0.0)" in res.output and "serve.tls" in res.output


def _reads(uid: int, groups: set[int], owner: int, group: int, mode: int) -> bool:
    """Whether a process of ``uid`` (in ``groups``) may read a file ``owner``:``group`` of ``mode`` (POSIX)."""
    if uid == 0:
        return True
    if uid == owner:
        return bool(mode & 0o400)
    if group in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def test_the_rayservice_mounts_the_tls_secret_readable_by_the_ray_images_user(certs, tmp_path, monkeypatch):
    """Kubernetes writes a Secret's files owned by root, group the pod's fsGroup (when set), with the volume's
    defaultMode; the rayproject/ray images run as uid 1000 (ray), primary group 100: the mode 0o400 of before left
    the key to root alone and HTTPS could not start."""
    from vitdeploy.serve.deploy_config import rayservice
    from vitdeploy.serve.runner import ServeSettings

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    cfg = load_config(_pipeline(tmp_path, "tls: {certfile: cert.pem, keyfile: key.pem}"))
    settings = ServeSettings(tmp_path, "ort", "0.0.0.0", 8000, 1, token_digest="0" * 64)
    cluster = rayservice(cfg, settings, "vit")["spec"]["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        pod = group["template"]["spec"]
        context = pod["securityContext"]
        uid = context.get("runAsUser", tls.RAY_UID)  # the image's user unless the pod says otherwise
        assert uid == tls.RAY_UID == 1000
        groups = {
            context.get("runAsGroup", tls.RAY_GID),
            context.get("fsGroup"),
            *context.get("supplementalGroups", []),
        }
        secret = next(v["secret"] for v in pod["volumes"] if v["name"] == "serve-tls")
        owner_group = context.get("fsGroup", 0)
        assert _reads(uid, groups, 0, owner_group, secret["defaultMode"]), (context, oct(secret["defaultMode"]))
        assert not secret["defaultMode"] & 0o007  # nobody else: the key stays the pod's
        assert not _reads(uid, groups - {owner_group}, 0, owner_group, 0o400)  # what it was: root's alone
