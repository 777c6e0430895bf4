"""`vitdeploy loadtest` and `vitdeploy tune`: load on a server, and serving settings chosen by measuring it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .console import refresh_report
from .options import cacert_option, export_folder_option, runtime_options, token_refused_option


@click.command("loadtest")
@click.argument("url")
@click.option("--model", default=None, help="the model's name (/v2/models/<name>); needed by v2-http and v2-grpc")
@click.option(
    "--images",
    type=click.Path(path_type=Path),
    default=None,
    help="folder of images sent in turn, one per request (default: the demo images)",
)
@click.option(
    "--protocol",
    type=click.Choice(["predict", "v2-http", "v2-grpc"]),
    default="predict",
    show_default=True,
    help="POST /predict, KServe v2 over HTTP, or over gRPC (URL host:port; needs tritonclient[grpc])",
)
@click.option("--concurrency", default=None, help="closed loop: comma-separated client counts, e.g. 1,4,16")
@click.option("--rate", default=None, help="open loop: comma-separated requests/s, e.g. 50,100")
@click.option("--poisson", is_flag=True, help="open loop: exponential gaps between requests instead of even ones")
@click.option("--duration", default=None, help="each level's length, e.g. 20s, 2m (default 20s)")
@click.option("--requests", type=click.IntRange(min=1), default=None, help="each level's requests instead")
@click.option("--warmup", default="2s", show_default=True, help="untimed load before the first level (0 for none)")
@token_refused_option
@click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="the export the server runs: an embedding model's requests ask for EMBEDDINGS instead of the top-k; "
    "the levels are saved beside it (loadtest-report.json: the report's serving section shows them)",
)
@cacert_option
@click.option("--json", "as_json", is_flag=True, help="print the JSON report on stdout instead of the table")
def loadtest(
    url: str,
    model: str | None,
    images: Path | None,
    protocol: str,
    concurrency: str | None,
    rate: str | None,
    poisson: bool,
    duration: str | None,
    requests: int | None,
    warmup: str,
    artifacts_dir: Path | None,
    ca_bundle: Path | None,
    as_json: bool,
) -> None:
    """Load a vitdeploy, Triton or any KServe v2 server: throughput, latency percentiles and errors per level."""
    from ..client.loadtest import (
        LoadPlan,
        format_loadtest,
        load_images,
        parse_duration,
        parse_levels,
        run_loadtest,
        save_loadtest,
    )
    from ..client.protocols import Target, asked_outputs
    from ..serve.auth import read_token

    token = read_token(None)  # VITDEPLOY_SERVE_TOKEN, never argv (--token is refused)

    seconds = parse_duration(duration) if duration else (None if requests else 20.0)
    plan = LoadPlan(
        target=Target(url, protocol, model, token, asked_outputs(artifacts_dir), ca_bundle=ca_bundle),
        images=load_images(images),
        concurrency=parse_levels(concurrency, "--concurrency") if concurrency else () if rate else (1,),
        rates=parse_levels(rate, "--rate", float) if rate else (),
        duration_s=seconds,
        requests=requests,
        poisson=poisson,
        warmup_s=0.0 if warmup.strip() in ("0", "0s") else parse_duration(warmup, "--warmup"),
    )
    report = run_loadtest(plan, progress=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in format_loadtest(report):
            click.echo(line)
    saved = save_loadtest(report, artifacts_dir) if artifacts_dir is not None else None
    if saved is not None:
        click.echo(f"saved: {saved}", err=True)
        page = refresh_report(artifacts_dir)  # its serving section draws where each level's time went
        if page:
            click.echo(f"report: {page}", err=True)


@click.command("tune")
@export_folder_option
@click.option(
    "--target",
    type=click.Choice(["serve", "triton"]),
    default="serve",
    show_default=True,
    help="vitdeploy serve (Ray Serve), or the generated Triton repository on the bundled tritonserver",
)
@click.option("--slo-p99-ms", type=click.FloatRange(min=0, min_open=True), default=None, help="the p99 latency goal")
@click.option("--budget", default="10m", show_default=True, help="time for the whole search, e.g. 90s, 10m")
@click.option(
    "--trials",
    type=click.IntRange(min=1),
    default=None,
    help="stop after this many measured settings (default: as many as --budget allows)",
)
@click.option(
    "-b", "--backend", default=None, help="tune this backend only (default: every one that passed validation)"
)
@click.option(
    "--images",
    type=click.Path(path_type=Path),
    default=None,
    help="folder of images sent in turn (default: the demo images; use your own: decoding is part of the cost)",
)
@click.option(
    "-o",
    "--output",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("tuned.yaml"),
    show_default=True,
    help="the overlay to write",
)
@click.option("--json", "as_json", is_flag=True, help="print every trial as JSON on stdout")
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="pipeline YAML whose serve: settings the search starts from (default: ./pipeline.yaml if present)",
)
def tune(
    artifacts_dir: Path | None,
    target: str,
    slo_p99_ms: float | None,
    budget: str,
    trials: int | None,
    backend: str | None,
    images: Path | None,
    out: Path,
    as_json: bool,
    config_path: Path | None,
) -> None:
    """Search the serving settings on this machine; write the best as a pipeline.yaml overlay (tuned.yaml).

    Starts its own server, measures each candidate with the load generator at the load where its throughput
    saturates and keeps the highest throughput whose p99 meets --slo-p99-ms (none given: within 2x its p50).
    Ctrl-C stops it cleanly: the server stops, the best so far is written."""
    from ..base.config import load_config
    from ..base.vocab import AUTO
    from ..client.loadtest import parse_duration
    from ..tune.overlay import write_outputs
    from ..tune.tuner import TunePlan, run_tune

    cfg = load_config(config_path)
    artifacts = Path(artifacts_dir or cfg.output_dir)
    plan = TunePlan(
        artifacts=artifacts,
        target=target,
        slo_p99_ms=slo_p99_ms,
        budget_s=parse_duration(budget, "--budget"),
        backend=backend or cfg.runtime.backend or AUTO,
        images=images,
        out=out,
        max_trials=trials,
    )
    result = run_tune(cfg, plan, runtime_options(cfg), progress=lambda line: click.echo(line, err=True))
    overlay, report = write_outputs(result, artifacts, out)
    if result.best is None and result.stopped != "interrupted":
        from ..base.errors import ConfigError

        raise ConfigError(f"--budget {budget}: not even the starting settings could be measured; give it more time")
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    if overlay is not None:
        gain = f" ({result.gain:.2f}x the {target} settings it started from)" if result.gain else ""
        figure = result.best.figure.summary()
        click.echo(f"wrote {overlay}: {result.best.candidate.describe()}, {figure}{gain}", err=True)
    if report is not None:
        click.echo(f"every trial: {report}", err=True)
        page = refresh_report(artifacts)  # its "Serving settings" section, where the export has a report
        if page:
            click.echo(f"report: {page}", err=True)
    if result.stopped == "interrupted":
        raise KeyboardInterrupt
    if result.best is not None and result.best.figure.best is None:
        from ..base.errors import ValidationError

        goal = f"--slo-p99-ms {slo_p99_ms:g}" if slo_p99_ms else "the objective (p99 within 2x its p50)"
        raise ValidationError(
            f"no setting met {goal}: {out} holds the closest ({result.best.figure.summary()}); "
            "give a higher --slo-p99-ms, more --budget, or a faster backend"
        )
