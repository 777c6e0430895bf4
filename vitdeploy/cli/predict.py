"""`vitdeploy predict`: images (files or folders) through the exported model, one line (or JSON object) each."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from .console import fit_path
from .options import backend_option, config_option, export_folder_option
from .sign import verify_key_option


@click.command("predict")
@click.argument(
    "inputs", nargs=-1, required=True, type=click.Path(path_type=Path, readable=False)
)  # each bad path: its own record
@export_folder_option
@backend_option
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=None, help="default: runtime.top_k (5)")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="default: runtime.batch_size (32)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line per input on stdout")
@click.option(
    "--patch-tokens",
    is_flag=True,
    help="an embedding export with model.patch_tokens: each record's patch tokens too ([P, D] lists; large)",
)
@click.option(
    "--image-size",
    type=click.IntRange(min=1),
    default=None,
    help="run at this side, one of the sizes an export for several sizes answers at (default: its base size)",
)
@verify_key_option
@config_option
def predict(
    inputs: tuple[Path, ...],
    artifacts_dir: Path | None,
    backend: str | None,
    top_k: int | None,
    batch_size: int | None,
    as_json: bool,
    patch_tokens: bool,
    image_size: int | None,
    verify_key: Path | None,
    config_path: Path | None,
) -> None:
    """Classify images (files or directories) with the exported model (an embedding model: their vectors)."""
    from ..base.config import load_config
    from ..runtime.batch_predict import predict_paths
    from ..runtime.predictor import Predictor

    cfg = load_config(config_path).with_verify_key(verify_key)
    rt = cfg.runtime
    top_k = top_k or rt.top_k
    predictor = Predictor.open(artifacts_dir, config=cfg, backend=backend, image_size=image_size)
    click.echo(f"backend: {predictor.backend_name} ({predictor.why})", err=True)
    failed = 0
    show_progress = not as_json and sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if total >= 64 and (show_progress or as_json):
            click.echo(f"\r  {done}/{total} images", err=True, nl=done == total)

    if not as_json:
        shown = "embedding (first values; --json gives the whole vector)" if predictor.is_embedding else None
        click.echo(f"{'path':<48} " + (shown or f"{'label':<16} {'score':>7}  top-{top_k}"))
    with predictor:
        size = batch_size or rt.batch_size
        for rec in predict_paths(
            predictor, list(inputs), batch_size=size, top_k=top_k, progress=progress, patch_tokens=patch_tokens
        ):
            failed += "error" in rec
            click.echo(json.dumps(rec) if as_json else _record_line(rec))
    if failed:
        click.echo(f"{failed} input(s) could not be read", err=True)
        sys.exit(1)


def _record_line(rec: dict[str, Any]) -> str:
    """One input's line of the table: its error, its embedding's first values, or its label and top-k."""
    if "error" in rec:
        return f"{fit_path(rec['path'], 48):<48} ERROR  {rec['error']}"
    if "embedding" in rec:
        vector = rec["embedding"]
        head = " ".join(f"{v:.4f}" for v in vector[:4])
        tokens = rec.get("patch_tokens")
        more = f" + patch tokens [{len(tokens)}, {len(tokens[0]) if tokens else 0}]" if tokens is not None else ""
        return f"{fit_path(rec['path'], 48):<48} [{head} ...] {len(vector)} values{more}"
    tops = ", ".join(f"{t['label']}:{t['score']:.3f}" for t in rec["top_k"])
    return f"{fit_path(rec['path'], 48):<48} {rec['label']:<16} {rec['score']:7.4f}  {tops}"
