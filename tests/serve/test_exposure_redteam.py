"""The red team (issue 49): a port opened by mistake, a credential written or printed where it must not be.

Ports, decided before anything starts (vitdeploy/serve/exposure.py; the sockets a real server opens and calls to
them from another interface: test_ray_app_auth.py): the gRPC proxy that Ray binds on every interface whatever
``--host`` says, hosts that only look local, the local Ray's node and metrics (kept on loopback:
tests/base/test_ray_loopback.py), Ray Serve's replicas with Ray's token authentication off, the RayService, the
startup lines that must name the real bind address.

Written files and printed lines: every file `export`, `report`, `triton-repo` and `serve --write-config /
--write-rayservice` write, and everything they print, scanned for planted secrets (a serve token, a user:password
OTLP endpoint, OTLP headers, a Hub token); no token field of a dataclass in a repr.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.cli import main
from vitdeploy.serve import exposure
from vitdeploy.serve.auth import TOKEN_ENV, digest
from vitdeploy.serve.exposure import Exposure, serve_token
from vitdeploy.serve.runner import ServeSettings, ready_lines

TOKEN = "redteam-serve-token-4e7a1c9b0d2f3865"
OTLP_USER, OTLP_PASSWORD = "collector-user", "redteam-otlp-password-77aa"
OTLP_HEADER = "redteam-otlp-header-31cd"
HF_TOKEN = "hf_redteamHubToken0123456789abcdef"
PLANTED = {
    TOKEN_ENV: TOKEN,
    "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://{OTLP_USER}:{OTLP_PASSWORD}@collector.example:4318/?key={OTLP_HEADER}x",
    "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Basic {OTLP_HEADER}",
    "HF_TOKEN": HF_TOKEN,
}
SECRETS = (TOKEN, digest(TOKEN), OTLP_PASSWORD, OTLP_HEADER, HF_TOKEN)


@pytest.fixture(autouse=True)
def ray_token_auth(monkeypatch):
    """A Ray of our own as Ray 2.60 starts one, with its token authentication (the tests' conftest turns it off)."""
    monkeypatch.delenv(exposure.RAY_AUTH_MODE_ENV, raising=False)


def _cli(args: list[str], env: dict[str, str | None] | None = None):
    return CliRunner().invoke(main, args, env={TOKEN_ENV: None, **(env or {})}, catch_exceptions=False)


def _pipeline(folder: Path, serve: str) -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(f"serve: {{{serve}}}\n")
    return path


# ------------------------------------------------------------------------------------------ ports


def test_grpc_beside_a_loopback_host_is_on_every_interface_and_refused_as_such(tmp_path):
    """The issue's measurement: serve --host 127.0.0.1 --port P with serve.grpc_port P+1 listened on 127.0.0.1:P and
    *:P+1 with no token and no TLS asked for. Now refused (exit 2, one line naming the port and [::]) until a token
    and --allow-insecure say so; the written Serve config (no gRPC) is not concerned."""
    pipeline = str(_pipeline(tmp_path, "port: 8100, grpc_port: 8101"))
    base = ["serve", "-a", str(tmp_path / "none"), "-c", pipeline, "--host", "127.0.0.1"]
    res = _cli(base)
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("error: serve.grpc_port 8101: ") and "([::]:8101)" in res.output
    assert "--allow-unauthenticated" in res.output and "VITDEPLOY_SERVE_TOKEN" in res.output
    res = _cli(base, env={TOKEN_ENV: TOKEN})
    assert res.exit_code == 2 and "serve token would travel in clear text" in res.output and TOKEN not in res.output
    res = _cli([*base, "--allow-insecure"], env={TOKEN_ENV: TOKEN})
    assert "does not exist" in res.output, res.output  # the policy let it through: the artifacts are next
    res = _cli([*base, "--allow-unauthenticated"])
    assert res.exit_code == 2 and "every request would travel in clear text" in res.output, res.output


def test_the_startup_lines_name_each_ports_real_bind_address():
    cfg = parse_config({"serve": {"grpc_port": 8101, "metrics_port": 8180}}, None)
    settings = ServeSettings(Path("."), "ort", "127.0.0.1", 8100, 1, token_digest=digest(TOKEN))
    lines = ready_lines(cfg, settings, "vit")
    text = "\n".join(lines)
    assert "ready: http://127.0.0.1:8100 " in text and "HTTP: 127.0.0.1:8100, this machine only" in text
    assert "gRPC:  [::]:8101, every interface: a token, no TLS" in text and "127.0.0.1:8101" not in text
    assert "metrics: http://127.0.0.1:8180/metrics" in text
    assert "replicas: [::]:<a port each>, every interface: Ray's token, no TLS" in text
    assert not any(secret in text for secret in SECRETS)
    ipv6 = ready_lines(cfg, ServeSettings(Path("."), "ort", "::1", 8100, 1), "vit")
    assert ipv6[0].startswith("ready: http://[::1]:8100 ")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "0", "127.0.0.2", "10.0.0.7", "my-host.example"])
def test_a_host_that_is_not_one_of_the_loopback_names_is_exposed(host):
    """Only 127.0.0.1, localhost and ::1 count as this machine only: "0" and "::" are every interface, and a name
    or another 127.x address is judged as the network (the safe side)."""
    cfg = parse_config({}, None)
    with pytest.raises(ConfigError, match=rf"^--host {host} lets anyone who reaches the port call the model"):
        serve_token(cfg, Exposure(host))


def test_the_local_ray_on_the_network_needs_both_allowances_its_metrics_having_neither_token_nor_tls(
    monkeypatch, tmp_path
):
    pytest.importorskip("cryptography")
    from helpers.certs import make_certs

    make_certs(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    serve = {"metrics_host": "0.0.0.0", "metrics_port": 8180, "tls": {"certfile": "cert.pem", "keyfile": "key.pem"}}
    cfg = parse_config({"serve": serve}, tmp_path / "pipeline.yaml")  # HTTPS with a token: the HTTP port is fine
    with pytest.raises(ConfigError, match=r"^serve.metrics_host 0.0.0.0 with --host on the network puts the local"):
        serve_token(cfg, Exposure("0.0.0.0"))
    with pytest.raises(ConfigError, match=r"metrics on port 8180, which has no token and no TLS.*--allow-insecure$"):
        serve_token(cfg, Exposure("0.0.0.0", allow_unauthenticated=True))
    assert serve_token(cfg, Exposure("0.0.0.0", allow_unauthenticated=True, allow_insecure=True)) == TOKEN
    assert serve_token(cfg, Exposure("127.0.0.1")) == TOKEN  # --host on loopback keeps Ray there too


def test_replicas_without_rays_token_authentication_are_refused(monkeypatch):
    monkeypatch.setenv(exposure.RAY_AUTH_MODE_ENV, "disabled")
    res = _cli(["serve", "-a", "/nonexistent-export"])
    assert res.exit_code == 2 and res.output.startswith("error: RAY_AUTH_MODE=disabled: Ray Serve's replicas"), (
        res.output
    )


def test_the_rayservice_is_judged_on_0000_whatever_host_says(tmp_path, tiny_artifacts):
    out = tmp_path / "rs.yaml"
    res = _cli(["serve", "-a", str(tiny_artifacts()), "--host", "127.0.0.1", "--write-rayservice", str(out)])
    assert res.exit_code == 2 and "the RayService (0.0.0.0) lets anyone" in res.output and not out.exists()
    res = _cli(["serve", "-a", str(tiny_artifacts()), "--write-rayservice", str(out), "--allow-unauthenticated"])
    assert res.exit_code == 2 and "the RayService (0.0.0.0) serves plain HTTP" in res.output and not out.exists()


# ------------------------------------------------------------------------------------------ written files


def _secret_fields(tree: ast.Module) -> list[tuple[str, str, bool]]:
    """(class, field, repr hidden) of each field named like a credential in the module's dataclasses."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any(d.split("(")[0].endswith("dataclass") for d in decorators):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            name = item.target.id
            words = name.split("_")
            if (
                not ({"token", "password", "secret", "credentials"} & set(words))
                or "bool" in ast.unparse(item.annotation).lower()
            ):
                continue
            hidden = isinstance(item.value, ast.Call) and any(
                k.arg == "repr" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in item.value.keywords
            )
            found.append((node.name, name, hidden))
    return found


def test_no_token_field_of_a_dataclass_is_in_its_repr():
    package = Path(exposure.__file__).resolve().parents[1]
    fields = []
    for path in sorted(package.rglob("*.py")):
        fields += [(path.relative_to(package).as_posix(), *f) for f in _secret_fields(ast.parse(path.read_text()))]
    assert {(p, c, n) for p, c, n, _ in fields} >= {
        ("serve/runner.py", "ServeSettings", "token_digest"),
        ("client/protocols.py", "Target", "token"),
    }, "the scan finds the known ones"
    shown = [f"{p}: {c}.{n}" for p, c, n, hidden in fields if not hidden]
    assert not shown, f"credential fields without field(repr=False): {shown}"
    settings = ServeSettings(Path("."), "ort", "127.0.0.1", 8000, 1, token_digest=digest(TOKEN))
    assert digest(TOKEN) not in repr(settings)


def _run(*args: str, env: dict[str, str]) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "vitdeploy.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert res.returncode == 0, (args, res.stderr[-3000:])
    return res.stdout + res.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_no_planted_secret_in_any_file_written_or_line_printed_by_export_report_triton_repo_and_serve(
    tiny_checkpoint, tmp_path
):
    import os

    import yaml

    env = {**os.environ, **PLANTED, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop(exposure.RAY_AUTH_MODE_ENV, None)
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(
        "export: {fp16: {enabled: false}, int8: {enabled: false}}\nserve: {tracing: {sampling_ratio: 0.5}}\n"
    )
    out, repo = tmp_path / "export", tmp_path / "repo"
    serve_yaml, kube_yaml = tmp_path / "serve.yaml", tmp_path / "rayservice.yaml"
    printed = [
        _run("export", str(tiny_checkpoint), "-c", str(cfg), "-o", str(out), "--engine", "skip", env=env),
        _run("report", "-a", str(out), "-c", str(cfg), env=env),
        _run("triton-repo", "-a", str(out), "-o", str(repo), "-c", str(cfg), env=env),
        _run(
            "serve",
            "-a",
            str(out),
            "-c",
            str(cfg),
            "--write-config",
            str(serve_yaml),
            "--write-rayservice",
            str(kube_yaml),
            "--allow-insecure",
            env=env,
        ),  # fmt: skip
    ]
    written = [p for p in (*out.rglob("*"), *repo.rglob("*"), serve_yaml, kube_yaml) if p.is_file()]
    assert len(written) > 10 and any(p.name == "report.html" for p in written)
    for path in written:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (path, secret)
    for text in printed:
        for secret in SECRETS:
            assert secret not in text, secret
    # what the RayService does instead: each credential from a Secret, the endpoint without its user:password
    doc = yaml.safe_load(kube_yaml.read_text())
    container = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env_vars = {e["name"]: e for e in container["env"]}
    assert env_vars["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "https://collector.example:4318/"
    assert env_vars["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {
        "name": "tiny-otlp",
        "key": "headers",
    }
    assert env_vars[TOKEN_ENV]["valueFrom"]["secretKeyRef"]["name"] == "tiny-serve-token"
    assert "kubectl create secret generic tiny-otlp" in kube_yaml.read_text()
    assert "OTEL_EXPORTER_OTLP_HEADERS" in serve_yaml.read_text()  # the config's comment says where they come from
