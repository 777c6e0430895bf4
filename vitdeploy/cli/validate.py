"""`vitdeploy validate`: each backend's drift from eager FP32 PyTorch on real images, here, or (``--url``) the
answers of a running server judged the same way. The two modes' options are declared (:data:`MODES`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from ..base.vocab import EVALUATED_BACKENDS, PRECISIONS
from .console import refresh_report
from .options import ModalCommand, Modes, artifacts_option, cacert_option, config_option, runtime_options

#: --url switches to judging a running server: --protocol, --model and --backend go with it, --backends without.
MODES = Modes(
    switch="url",
    switched=("protocol", "model", "backend", "ca_bundle"),
    switched_error="--protocol, --model, --backend and --cacert judge a running server: they go with --url URL",
    unswitched=("backends",),
    unswitched_error="--backends names in-process backends; with --url, --backend names the thresholds",
)


@click.command("validate", cls=ModalCommand, modes=MODES)
@artifacts_option
@click.option(
    "--images",
    type=click.Path(path_type=Path),
    default=None,
    help="folder of validation images (default: validation.images from the config, else the demo images)",
)
@click.option(
    "--labels",
    "labels_file",
    type=click.Path(path_type=Path),
    default=None,
    help="CSV 'path,label' (paths relative to the CSV or the images folder); default: IMAGES/labels.csv, "
    "else sub-folder names",
)
@click.option(
    "-b",
    "--backends",
    default=None,
    help=f"comma-separated backends: {','.join(EVALUATED_BACKENDS)} (default: all; those that cannot run "
    "here are listed with the reason)",
)
@click.option(
    "--url",
    default=None,
    help="judge a running server instead: its answers to the images, sent as a client sends them "
    "(http://host:port; v2-grpc: host:port)",
)
@click.option(
    "--protocol",
    type=click.Choice(["predict", "v2-http", "v2-grpc"]),
    default=None,
    help="with --url: POST /predict (default), KServe v2 over HTTP, or over gRPC",
)
@click.option("--model", default=None, help="with --url: the model's name (default: the export's)")
@click.option(
    "--backend",
    default=None,
    help="with --url: judge with this backend's thresholds (default: the backend the server says it runs)",
)
@click.option(
    "--image-size",
    type=click.IntRange(min=1),
    default=None,
    help="an export for several sizes: judge at this size only (default: every listed size; with --url: the "
    "base size, or this one asked of the server as image_size)",
)
@cacert_option
@click.option("--json", "as_json", is_flag=True, help="print the JSON report on stdout instead of the table")
@config_option
def validate(
    artifacts_dir: Path,
    images: Path | None,
    labels_file: Path | None,
    backends: str | None,
    url: str | None,
    protocol: str | None,
    model: str | None,
    backend: str | None,
    image_size: int | None,
    ca_bundle: Path | None,
    as_json: bool,
    config_path: Path | None,
) -> None:
    """Measure each backend's drift from eager FP32 PyTorch on real images; exit 3 if any fails.

    An export for several sizes is judged at each of its sizes (--image-size: one). With --url, judge a running
    server (vitdeploy serve, Triton) the same way: exit 3 when its answers fail the thresholds or it runs
    another export than -a, 4 when it does not answer."""
    from ..base.config import load_config

    cfg = load_config(config_path)
    if images is None and labels_file is None:
        images = cfg.resolve(cfg.validation.images)
    judged = {  # what both modes judge, and by which thresholds
        "images": images,
        "labels_file": labels_file,
        "thresholds": {key: getattr(cfg.validation, key) for key in PRECISIONS},
        "options": runtime_options(cfg),
        "max_pixels": cfg.runtime.max_image_pixels,
        "image_size": image_size,
    }
    if url is not None:
        from ..client.served_report import format_served

        check = _check_url(cfg, artifacts_dir, url, protocol, model, backend, {**judged, "ca_bundle": ca_bundle})
        _print_report(check, format_served, artifacts_dir, as_json)
        return
    from ..evaluate.drift import run_drift
    from ..evaluate.drift_table import format_drift_table

    report = run_drift(artifacts_dir, backends=backends, **judged)
    _print_report(report, format_drift_table, artifacts_dir, as_json)


def _check_url(
    cfg: Any,
    artifacts_dir: Path,
    url: str,
    protocol: str | None,
    model: str | None,
    backend: str | None,
    judged: dict[str, Any],
) -> Any:
    """`validate --url`: the server's answers judged against eager PyTorch (client/served_check.py)."""
    from ..client.served_check import check_served
    from ..serve.auth import read_token

    token_file = cfg.resolve(Path(cfg.serve.token_file)) if cfg.serve.token_file else None
    token = read_token(token_file)
    return check_served(
        artifacts_dir, url, protocol=protocol or "predict", model=model, token=token, backend=backend, **judged
    )


def _print_report(report: Any, table: Callable[[Any], list[str]], artifacts_dir: Path, as_json: bool) -> None:
    """The drift report (or the served check) as a ``table`` or JSON; the export's report page follows it (the
    accuracy section, the served row beside the in-process backends); exit 3 on a failure."""
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in table(report):
            click.echo(line)
    if report.report_path and Path(report.report_path).parent == Path(artifacts_dir):
        refresh_report(artifacts_dir)
    report.raise_for_failures()
