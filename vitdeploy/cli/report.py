"""`vitdeploy report`: one self-contained HTML page, and the recommendation it makes."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .options import artifacts_option, config_option
from .sign import verify_key_option


@click.command("report")
@artifacts_option
@click.option(
    "-o",
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="the HTML file to write (default: report.html in the artifacts folder)",
)
@click.option(
    "--bench",
    "bench_mode",
    default="skip",
    show_default=True,
    help="auto: a short benchmark here when none is saved; skip: only a saved one; or a bench report JSON file",
)
@click.option(
    "--no-images", is_flag=True, help="leave the flipped images' thumbnails out (data that must not be copied)"
)
@click.option("--json", "as_json", is_flag=True, help="print the recommendation and the figures behind it as JSON")
@verify_key_option
@config_option
def report_cmd(
    artifacts_dir: Path,
    out_path: Path | None,
    bench_mode: str,
    no_images: bool,
    as_json: bool,
    verify_key: Path | None,
    config_path: Path | None,
) -> None:
    """One self-contained HTML page: accuracy and speed of every backend here, and what to deploy."""
    from ..base.config import load_config
    from ..evaluate.report import write_report

    key = load_config(config_path).with_verify_key(verify_key).verify_key  # the signature's line: verified or not
    path, rec, facts = write_report(artifacts_dir, out_path, bench=bench_mode, images=not no_images, public_key=key)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "report": str(path),
                    "recommendation": rec.to_dict(),
                    "candidates": [vars(c) for c in facts.candidates()],
                },
                indent=2,
            )
        )
        return
    if rec.nothing:
        click.echo(f"nothing to recommend: {rec.nothing}")
    for pick in rec.picks:
        click.echo(f"{pick.target:<10} {pick.backend:<10} {pick.why}")
    click.echo(f"report: {path}")
