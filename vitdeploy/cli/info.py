"""`vitdeploy info` (this machine, a model before its export, an export's origin) and `vitdeploy config`
(pipeline.yaml checked, and its reference)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .options import config_option, model_argument, revision_option


@click.command("info")
@model_argument
@revision_option
@click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    type=click.Path(path_type=Path, readable=False),
    default=None,
    help="an export folder: where its model came from (Hub repo, revision, commit, files' sha256), as recorded",
)
@config_option
def info(model: str | None, revision: str | None, artifacts_dir: Path | None, config_path: Path | None) -> None:
    """This machine (libraries, providers, backends); with MODEL (a path or a Hub name, org/name[@revision]) what
    `export` would make of it, before any export stage runs; with -a where an export's model came from."""
    if artifacts_dir is not None:
        from ..evaluate.model_info import export_lines

        lines = export_lines(artifacts_dir)
    elif model is not None or revision is not None or config_path is not None:
        from ..base.config import load_config
        from ..evaluate.model_info import model_lines

        lines = model_lines(load_config(config_path).with_checkpoint(model, revision))
    else:
        from ..evaluate.environment import environment_report

        lines = list(environment_report())
    for line in lines:
        click.echo(line)


@click.group("config")
def config_group() -> None:
    """Work with pipeline.yaml."""


@config_group.command("check")
@config_option
def config_check(config_path: Path | None) -> None:
    """Validate a pipeline YAML and print the effective configuration."""
    from ..base.config import load_config
    from ..export.effective import describe, resolve

    cfg = load_config(config_path)
    effective = resolve(cfg)  # loads the checkpoint: the preprocessing shown is what export will use
    click.echo(f"{cfg.source or 'built-in defaults'}: OK")
    click.echo(json.dumps(effective.config_dump(cfg), indent=2))
    for line in describe(effective, cfg):
        click.echo(line)


@config_group.command("reference")
def config_reference() -> None:
    """Print the pipeline.yaml reference (Markdown), generated from the config models: docs/configuration.md."""
    from ..base.config_reference import reference_markdown

    click.echo(reference_markdown(), nl=False)
