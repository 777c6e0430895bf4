"""The serve token (vitdeploy/serve/auth.py) without a server: where it is read from, what is refused,
how a header is judged; and the command's refusal to expose an unauthenticated model, which needs no
Ray (it is refused before Ray starts). The real server with a token: test_ray_app_auth.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from vitdeploy.base.errors import ConfigError, UnauthorizedError
from vitdeploy.cli import main
from vitdeploy.serve import auth
from vitdeploy.serve.http_errors import status_of

TOKEN = "s3cret-token-for-the-tests-0123456789"


def run_cli(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_the_token_comes_from_the_environment_or_a_file_never_both(tmp_path):
    assert auth.read_token(None, {}) is None
    assert auth.read_token(None, {auth.TOKEN_ENV: TOKEN + "\n"}) == TOKEN
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert auth.read_token(path, {}) == TOKEN
    with pytest.raises(ConfigError, match="set twice") as twice:
        auth.read_token(path, {auth.TOKEN_ENV: TOKEN})
    assert TOKEN not in str(twice.value)


@pytest.mark.parametrize(
    "content, fragment", [("", "is empty"), ("short", "at least 16"), ("with a space inside it", "without spaces")]
)
def test_an_unusable_token_is_refused_naming_where_it_came_from_not_the_token(tmp_path, content, fragment):
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(ConfigError, match=fragment) as bad:
        auth.read_token(path, {})
    assert str(path) in str(bad.value) and (not content or content not in str(bad.value))
    with pytest.raises(ConfigError, match=auth.TOKEN_ENV):
        auth.read_token(None, {auth.TOKEN_ENV: content})
    with pytest.raises(ConfigError, match="cannot read it"):
        auth.read_token(tmp_path / "missing", {})


def test_a_header_passes_only_with_the_same_token():
    expected = auth.digest(TOKEN)
    auth.authorize(f"Bearer {TOKEN}", expected)
    auth.authorize(f"bearer  {TOKEN} ", expected)  # the scheme is case-insensitive (RFC 7235)
    auth.authorize(None, None)  # no token configured: open
    for header, fragment in [
        (None, "needs the serve token"),
        ("", "needs the serve token"),
        (f"Basic {TOKEN}", "needs the serve token"),
        ("Bearer", "needs the serve token"),
        (f"Bearer {TOKEN}x", "does not match"),
        (f"Bearer {TOKEN[:-1]}", "does not match"),
    ]:
        with pytest.raises(UnauthorizedError, match=fragment) as refused:
            auth.authorize(header, expected)
        assert status_of(refused.value) == 401 and TOKEN not in str(refused.value)
    assert auth.from_metadata([("x-other", "1"), ("authorization", f"Bearer {TOKEN}")]) == f"Bearer {TOKEN}"
    assert auth.from_metadata(None) is None


def test_the_guard_reads_the_digest_and_the_probes_stay_open():
    assert auth.digest_from_environment({}) is None
    assert auth.digest_from_environment({auth.TOKEN_ENV: TOKEN}) == auth.digest(TOKEN)
    assert auth.digest_from_environment({auth.DIGEST_ENV: auth.digest(TOKEN).upper()}) == auth.digest(TOKEN)
    assert all(auth.is_open(p) for p in ("/v2/health/live", "/v2/health/ready/", "/v2/models/m/ready"))
    assert not any(auth.is_open(p) for p in ("/v2", "/predict", "/v2/models/m", "/v2/models/m/infer", "/metrics"))


@pytest.mark.integration
def test_a_network_host_without_a_token_is_refused_before_anything_starts(demo_artifacts, tmp_path, monkeypatch):
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    res = run_cli(["serve", "-a", str(demo_artifacts), "--host", "0.0.0.0"])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--host 0.0.0.0" in lines[0] and "VITDEPLOY_SERVE_TOKEN" in lines[0]
    assert "--allow-unauthenticated" in lines[0] and "Traceback" not in res.output
    # a RayService listens on 0.0.0.0: the same refusal
    res = run_cli(["serve", "-a", str(demo_artifacts), "--write-rayservice", str(tmp_path / "rs.yaml")])
    assert res.exit_code == 2 and "RayService" in res.output and not (tmp_path / "rs.yaml").exists()


@pytest.mark.integration
def test_written_configs_reference_the_token_and_never_hold_it(demo_artifacts, tmp_path, monkeypatch):
    import yaml

    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    config, kube = tmp_path / "serve.yaml", tmp_path / "rayservice.yaml"
    both = ["--write-config", str(config), "--write-rayservice", str(kube), "--allow-insecure"]  # HTTPS: test_tls.py
    res = run_cli(["serve", "-a", str(demo_artifacts), *both])
    assert res.exit_code == 0, res.output
    for path in (config, kube):
        text = path.read_text()
        assert TOKEN not in text and auth.digest(TOKEN) not in text, path
    assert "VITDEPLOY_SERVE_TOKEN" in config.read_text()  # the comment says where the nodes get it
    doc = yaml.safe_load(kube.read_text())
    for group in (
        doc["spec"]["rayClusterConfig"]["headGroupSpec"],
        doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0],
    ):
        env = {e["name"]: e for e in group["template"]["spec"]["containers"][0]["env"]}
        ref = env[auth.TOKEN_ENV]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "vit-demo-digits-serve-token", "key": "token"}
    assert "kubectl create secret generic vit-demo-digits-serve-token" in kube.read_text()
    # a token file is a path the nodes read, kept in the serve config; the RayService takes the Secret instead
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    monkeypatch.delenv(auth.TOKEN_ENV)
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"serve: {{token_file: {token_file}}}\n")
    res = run_cli(
        [
            "serve",
            "-a",
            str(demo_artifacts),
            "-c",
            str(pipeline),
            "--write-config",
            str(config),
            "--write-rayservice",
            str(kube),
            "--allow-insecure",
        ]
    )
    assert res.exit_code == 0, res.output
    args = yaml.safe_load(config.read_text())["applications"][0]["args"]
    assert args["pipeline"]["serve"]["token_file"] == str(token_file) and TOKEN not in config.read_text()
    served = yaml.safe_load(yaml.safe_load(kube.read_text())["spec"]["serveConfigV2"])
    assert served["applications"][0]["args"]["pipeline"]["serve"]["token_file"] is None
