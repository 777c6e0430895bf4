"""`vitdeploy serve`: the export on Ray Serve, or the files to deploy it elsewhere (--write-config,
--write-rayservice). Who may call it (a token, TLS) is serve/exposure.py's decision."""

from __future__ import annotations

from pathlib import Path

import click

from .options import backend_option, config_option, runtime_options
from .sign import verify_key_option


@click.command("serve")
@click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    default=None,
    help="directory written by `vitdeploy export` (default: export.output_dir from the config); with "
    "--write-config also a file:// s3:// or gs:// URI",
)
@backend_option
@click.option("--host", default=None, help="address to listen on (default: serve.host, 127.0.0.1)")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="HTTP port (default: serve.port, 8000)")
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="replicas (default: serve.replicas, 1)")
@click.option(
    "--address",
    default=None,
    help="join this Ray cluster (e.g. auto, or ray://head:10001) instead of starting a local Ray",
)
@click.option("--access-log", is_flag=True, help="log every request (Ray Serve's access log)")
@click.option(
    "--allow-unauthenticated",
    is_flag=True,
    help="open ports beyond loopback (a network --host, serve.grpc_port, a RayService) without a serve token "
    "(VITDEPLOY_SERVE_TOKEN or serve.token_file)",
)
@click.option(
    "--allow-insecure",
    is_flag=True,
    help="open ports beyond loopback without TLS (plain HTTP, serve.grpc_port: Ray's gRPC proxy has none): a "
    "TLS-terminating ingress is in front (else set serve.tls)",
)
@click.option(
    "--name",
    default=None,
    help="the model's name and route /v2/models/<name> (default: serve.name, "
    "else the manifest's name); several models can be served on one cluster under their names",
)
@click.option(
    "--write-config",
    "write_config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write a Ray Serve config for `serve deploy` (artifacts from -a: a path or file:// s3:// gs:// URI) and exit",
)
@click.option(
    "--write-rayservice",
    "write_rayservice",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write a KubeRay RayService manifest with that config and exit",
)
@verify_key_option
@config_option
def serve(
    artifacts_dir: str | None,
    backend: str | None,
    host: str | None,
    port: int | None,
    replicas: int | None,
    address: str | None,
    access_log: bool,
    allow_unauthenticated: bool,
    allow_insecure: bool,
    name: str | None,
    write_config: Path | None,
    write_rayservice: Path | None,
    verify_key: Path | None,
    config_path: Path | None,
) -> None:
    """Serve the model over HTTP on Ray Serve: POST /predict, the KServe v2 protocol, dynamic batching.

    With a token (VITDEPLOY_SERVE_TOKEN, or the file serve.token_file names) every model route needs
    Authorization: Bearer <token>. Every port beyond loopback (a network --host, serve.grpc_port, which Ray binds
    on every interface) needs a token unless --allow-unauthenticated, and TLS (serve.tls) unless --allow-insecure."""
    from ..base.config import load_config
    from ..serve.auth import digest
    from ..serve.exposure import Exposure, serve_token
    from ..serve.runner import ServeSettings, run_server

    cfg = load_config(config_path).with_verify_key(verify_key)
    sv = cfg.serve
    exposure = Exposure(
        host=host or sv.host,
        write_config=write_config is not None,
        write_rayservice=write_rayservice is not None,
        allow_unauthenticated=allow_unauthenticated,
        allow_insecure=allow_insecure,
        port=port,
        address=address,
    )
    token = serve_token(cfg, exposure)
    source = artifacts_dir if artifacts_dir and "://" in artifacts_dir else Path(artifacts_dir or cfg.output_dir)
    settings = ServeSettings(
        artifacts=source,
        backend=backend or cfg.runtime.backend,
        host=exposure.host,
        port=port or sv.port,
        replicas=replicas or sv.replicas,
        address=address,
        access_log=access_log,
        name=name,
        token_digest=digest(token) if token else None,
    )
    if write_config or write_rayservice:
        from ..serve.deploy_config import write_deploy_files

        for path in write_deploy_files(cfg, settings, config_path=write_config, rayservice_path=write_rayservice):
            click.echo(f"wrote {path}", err=True)
        return
    run_server(cfg, settings, runtime_options(cfg), progress=lambda line: click.echo(line, err=True))
