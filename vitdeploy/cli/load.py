"""`vitdeploy loadtest` and `vitdeploy tune`: load on a server, and serving settings chosen by measuring it.

The commands are registered by ``cli/__init__.py``, which wraps each callback in its one error handler.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..serve.auth import TOKEN_ENV


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
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    show_envvar=True,
    help="bearer token of a server started with one (read from the environment rather than typed)",
)
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
    token: str | None,
    as_json: bool,
) -> None:
    """Load a vitdeploy, Triton or any KServe v2 server: throughput, latency percentiles and errors per level."""
    from ..tune.clients import Target
    from ..tune.loadtest import LoadPlan, format_loadtest, load_images, parse_duration, parse_levels, run_loadtest

    seconds = parse_duration(duration) if duration else (None if requests else 20.0)
    plan = LoadPlan(
        target=Target(url, protocol, model, token),
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
