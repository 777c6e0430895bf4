"""`vitdeploy rollout`: a new export onto a running `vitdeploy serve`, promoted or rolled back on live traffic."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from ..base.vocab import AUTO, RUNTIME_BACKENDS
from .options import cacert_option, runtime_options, token_refused_option
from .sign import verify_key_option

_COUNT = re.compile(r"^\s*\d+\s*$")
MIN_LEASE_S = 1.0


@click.command("rollout")
@click.argument("url", required=False)
@click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="the new export (a folder written by `vitdeploy export`)",
)
@click.option("--model", default=None, help="the model's name on the server (default: the one it serves)")
@click.option(
    "-b",
    "--backend",
    type=click.Choice([AUTO, *RUNTIME_BACKENDS]),
    default=None,
    help="the new version's backend (default: runtime.backend from the config, i.e. auto)",
)
@click.option(
    "--address",
    default=None,
    help="the server's Ray cluster: the address of the `Ray at ...` line `vitdeploy serve` printed "
    "(default: RAY_ADDRESS, else the one cluster running on this machine, found as Ray's own tools find it)",
)
@click.option(
    "--shadow",
    default="200",
    show_default=True,
    help="copy the next N unversioned requests to the new version (a number), or every one for a time (2m)",
)
@click.option(
    "--timeout",
    default="10m",
    show_default=True,
    help="with a count: the shadow's time limit (fewer requests by then: not enough traffic, rolled back)",
)
@click.option(
    "--start-timeout",
    default="5m",
    show_default=True,
    help="the time the new version has to start (Ray cannot place it, it crashes: rolled back)",
)
@click.option(
    "--max-slowdown",
    type=click.FloatRange(min=1.0),
    default=None,
    help="roll back a version whose p50 latency is over this many times the live one's (default: reported only)",
)
@click.option(
    "--min-agreement",
    type=click.FloatRange(min=0.0, max=1.0),
    default=None,
    help="roll back a version whose top-1 agreement with the live one on the shadowed requests is below this "
    "(an embedding model: its lowest cosine) (default: measured and reported only)",
)
@click.option(
    "--same-model",
    is_flag=True,
    help="the new export has the live version's weights (a re-export, another backend or precision): roll it back "
    "unless it answers as the live one does, within its backend's validation thresholds",
)
@click.option(
    "--lease",
    default="30s",
    show_default=True,
    help="how long the rollout's lease on the model lasts unrenewed (renewed every quarter of it): after a crash, "
    "the next rollout (or --status) takes over once it expired",
)
@token_refused_option
@click.option("--status", "show_status", is_flag=True, help="show the versions and the rollouts' history, then exit")
@click.option("--json", "as_json", is_flag=True, help="print the result (or --status) as JSON on stdout")
@cacert_option
@verify_key_option
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="pipeline YAML whose serve: settings the new version gets, as `serve -c` (default: ./pipeline.yaml)",
)
def rollout(
    url: str | None,
    artifacts_dir: Path | None,
    model: str | None,
    backend: str | None,
    address: str | None,
    shadow: str,
    timeout: str,
    start_timeout: str,
    max_slowdown: float | None,
    min_agreement: float | None,
    same_model: bool,
    lease: str,
    show_status: bool,
    as_json: bool,
    ca_bundle: Path | None,
    verify_key: Path | None,
    config_path: Path | None,
) -> None:
    """Start a new export beside the live version of a running `vitdeploy serve` (version N+1), check it answers
    as its own export does, copy live requests to it, and promote it (unversioned traffic moves, the old version
    drains and stops) or roll it back (the live version never stopped), by what it answered. One line says which
    and why."""
    from ..base.config import load_config
    from ..base.errors import BackendError, ConfigError, ValidationError
    from ..client.loadtest import parse_duration
    from ..client.rollout.driver import RolloutPlan, run_rollout
    from ..client.rollout.status import format_status, rollout_status
    from ..serve.auth import read_token

    if show_status:
        status = rollout_status(address, progress=lambda line: click.echo(line, err=True))
        lines = [json.dumps(status, indent=2, default=str)] if as_json else format_status(status, model)
        for line in lines:
            click.echo(line)
        return
    if not url or artifacts_dir is None:
        raise ConfigError("vitdeploy rollout URL -a NEW_EXPORT: give the server's URL and the new export")
    cfg = load_config(config_path).with_verify_key(verify_key)
    token = read_token(cfg.resolve(cfg.serve.token_file) if cfg.serve.token_file else None)  # as `serve` reads it
    count = _COUNT.match(shadow)
    plan = RolloutPlan(
        url=url,
        artifacts=artifacts_dir,
        backend=backend or cfg.runtime.backend,
        model=model,
        address=address,
        shadow_requests=int(shadow) if count else None,
        shadow_seconds=None if count else parse_duration(shadow, "--shadow"),
        timeout_s=parse_duration(timeout, "--timeout"),
        start_timeout_s=parse_duration(start_timeout, "--start-timeout"),
        max_slowdown=max_slowdown,
        token=token,
        ca_bundle=None if ca_bundle is None else str(ca_bundle),
        min_agreement=min_agreement,
        same_model=same_model,
        lease_s=parse_duration(lease, "--lease"),
    )
    if plan.lease_s < MIN_LEASE_S:
        raise ConfigError(f"--lease {lease}: at least {MIN_LEASE_S:g}s (it is renewed every quarter of it)")
    if plan.shadow_requests is not None and plan.shadow_requests < 1:
        raise ConfigError("--shadow 0: copy at least one request (or give a time, e.g. 2m)")
    result = run_rollout(cfg, plan, runtime_options(cfg), progress=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    if result.interrupted:  # Ctrl-C or SIGTERM: 130, and where it left the model (rolled back, or promoted)
        click.echo(f"interrupted: {result.line()}", err=True)
        raise click.exceptions.Exit(130)
    if result.promoted:
        click.echo(result.line())
    elif result.failed_start:
        raise BackendError(result.line())
    else:
        raise ValidationError(result.line())
