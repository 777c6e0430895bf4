"""`vitdeploy batch-predict`: image collections classified (or embedded) on Ray Data."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..base.vocab import EMBEDDING_DTYPES
from .options import backend_option, config_option, runtime_options
from .sign import verify_key_option


@click.command("batch-predict")
@click.argument("inputs", nargs=-1, required=True)
@click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    default=None,
    help="export directory or URI (file://, s3://, gs://) (default: export.output_dir from the config)",
)
@click.option(
    "-o",
    "--output",
    required=True,
    help="a folder (Parquet part files), x.parquet (one file) or x.jsonl (JSON Lines; classifiers only)",
)
@click.option(
    "--address", default=None, help="Ray cluster to run on (e.g. auto, ray://head:10001); default: a local Ray"
)
@backend_option
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="inference actors (default: batch.workers, auto: one per core on a Ray started here, else 1)",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="images per model call (default: batch.batch_size, else the export's batch profile opt)",
)
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=None, help="default: runtime.top_k (5)")
@click.option(
    "--embedding-dtype",
    type=click.Choice(EMBEDDING_DTYPES),
    default=None,
    help="an embedding export's vectors in the Parquet output (default: batch.embedding_dtype, float32)",
)
@click.option(
    "--patch-tokens",
    is_flag=True,
    default=None,
    help="an export with model.patch_tokens: a patch_tokens column beside each vector (default: batch.patch_tokens)",
)
@click.option("--resume", is_flag=True, help="continue an existing output: inputs already answered are skipped")
@verify_key_option
@config_option
def batch_predict(
    inputs: tuple[str, ...],
    artifacts_dir: str | None,
    output: str,
    address: str | None,
    backend: str | None,
    workers: int | None,
    batch_size: int | None,
    top_k: int | None,
    embedding_dtype: str | None,
    patch_tokens: bool | None,
    resume: bool,
    verify_key: Path | None,
    config_path: Path | None,
) -> None:
    """Classify (or embed) image collections on Ray Data: files, folders, globs, list files (.txt/.csv/.parquet),
    URIs. An embedding export writes Parquet: path, embedding (a fixed-size list of floats), error."""
    from ..base.config import load_config
    from ..batch.job import batch_settings_from_config, run_batch

    cfg = load_config(config_path).with_verify_key(verify_key)
    settings = batch_settings_from_config(
        cfg,
        inputs,
        artifacts=artifacts_dir,
        output=output,
        address=address,
        backend=backend,
        workers=workers,
        batch_size=batch_size,
        top_k=top_k,
        embedding_dtype=embedding_dtype,
        patch_tokens=patch_tokens or None,
        resume=resume,
        progress_bars=sys.stderr.isatty(),
    )
    summary = run_batch(
        settings,
        options=runtime_options(cfg),
        max_pixels=cfg.runtime.max_image_pixels,
        progress=lambda line: click.echo(line, err=True),
    )
    click.echo(summary.line(), err=True)
    if summary.failed:
        click.echo(f"{summary.failed} input(s) could not be read (their rows hold the reason)", err=True)
        sys.exit(1)
