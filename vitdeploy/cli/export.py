"""`vitdeploy export`: the export's stages as they run, then its artifacts, its peak memory and the command
to run next."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from ..base.errors import RefusedStagesError
from ..base.memory import human
from .console import CONSOLE, StageReporter, file_size, refresh_report
from .options import config_option, model_argument, revision_option
from .sign import sign_key_option


@click.command("export")
@model_argument
@revision_option
@config_option
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="output directory (default: export.output_dir from the config)",
)
@sign_key_option
@click.option(
    "--engine",
    type=click.Choice(["auto", "require", "skip"]),
    default="auto",
    show_default=True,
    help="TensorRT engine: build when TensorRT and a CUDA GPU exist (auto), fail without them (require), never (skip)",
)
@click.option(
    "--labels",
    "labels",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="a zero-shot classifier: class names, one a line; MODEL's text tower (CLIP, SigLIP) embeds them once and "
    "the image-only graph classifies (model.zero_shot.labels; docs/zero-shot.md)",
)
@click.option(
    "--template",
    "templates",
    multiple=True,
    help="with --labels: a prompt holding '{}' where the class name goes (repeat for several; default: CLIP's 7 "
    "ImageNet templates; model.zero_shot.templates)",
)
def export(
    model: str | None,
    revision: str | None,
    config_path: Path | None,
    sign_key: Path | None,
    out_dir: Path | None,
    engine: str,
    labels: Path | None,
    templates: tuple[str, ...],
) -> None:
    """Export MODEL (a checkpoint file or folder, or a Hugging Face Hub name: org/name[@revision],
    hf-hub:timm/<model>.<tag>; default: model.checkpoint of the config): ONNX, FP16 ONNX, TensorRT engine,
    validation, manifest. With --labels: a zero-shot classifier compiled from MODEL's two towers."""
    from ..base.config import load_config
    from ..export.api import export_model

    cfg = load_config(config_path).with_zero_shot(labels, templates)
    shown = cfg.with_checkpoint(model, revision)  # what the export will run: for the lines printed around it
    click.echo(f"exporting to {out_dir or shown.output_dir}", err=True)
    try:
        result = export_model(
            model, out_dir, cfg, revision=revision, engine=engine, on_stage=StageReporter(CONSOLE), sign_key=sign_key
        )  # type: ignore[arg-type]
    except RefusedStagesError as exc:  # written without what was refused: list it, then the error line
        _print_export(shown, exc.result)
        raise
    _print_export(shown, result)


def _memory_terms(peak: int, record: dict[str, int]) -> str:
    """`` = <held> held without the model + <k>x its <w> of FP32 weights``, where the export recorded both."""
    weights, held = record.get("weights_bytes"), record.get("held_without_model_bytes")
    if not weights or not held:
        return ""
    share = (peak - held) / weights
    return f" = {human(held)} held without the model + {share:.1f}x its {human(weights)} of FP32 weights"


def _print_export(cfg: Any, result: Any) -> None:
    click.echo("artifacts:")
    for role, path in result.artifacts.items():
        click.echo(f"  {role:<15} {path}  ({file_size(path)})")
    click.echo(f"  {'manifest':<15} {result.manifest_path}")
    if result.signature is not None:
        click.echo(f"  {'signature':<15} {result.signature.path}  (by {result.signature.short_signer})")
    for refusal in result.refused:
        click.echo(f"  refused: {', '.join(refusal['artifacts'])} ({refusal['stage']})")
    peaks = [s for s in result.stages if getattr(s, "peak_rss", None)]
    if peaks:
        top = max(peaks, key=lambda s: s.peak_rss)
        terms = _memory_terms(top.peak_rss, result.memory)
        click.echo(f"peak memory: {human(top.peak_rss)} ({top.name}){terms}; every stage's peak: manifest.json stages")
    report = refresh_report(result.out_dir, always=True)
    if report:
        click.echo(f"report:  {report}  (what to deploy; speed: `vitdeploy bench -a {_shell_path(result.out_dir)}`)")
    click.echo(f"next: {next_predict_command(cfg, result.out_dir)}")


def next_predict_command(cfg: Any, out_dir: Path) -> str:
    """The `predict` command to run next, as it runs from the current directory: the vitdeploy
    that is running now (``.venv/bin/vitdeploy`` when it is not on PATH), the images validated
    on (the demo digits for the demo model; a placeholder for a user's model) and ``out_dir``."""
    from ..demo import IMAGES_DIR as DEMO_IMAGES_DIR

    images = cfg.resolve(cfg.validation.images)
    if images is None and cfg.checkpoint_ref is None:
        images = DEMO_IMAGES_DIR
    shown = _shell_path(images) if images is not None else "path/to/your/images"
    return f"{_self_command()} predict {shown} -a {_shell_path(out_dir)}"


def _shell_path(path: Path | str) -> str:
    """``path`` relative to the current directory when it lies under it, quoted for a shell."""
    import shlex

    path = Path(os.path.abspath(path))  # not resolve(): .venv/bin/python is a link out of the venv
    try:
        path = path.relative_to(os.getcwd())
    except (OSError, ValueError):
        pass
    return shlex.quote(str(path))


def _self_command() -> str:
    """How to run this vitdeploy again from the current directory: ``vitdeploy`` when that name
    on PATH is this very script, else its path (``.venv/bin/vitdeploy``), or ``python -m``."""
    import shutil

    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "vitdeploy" and argv0.is_file():
        on_path = shutil.which("vitdeploy")
        if on_path and Path(on_path).resolve() == argv0.resolve():
            return "vitdeploy"
        return _shell_path(argv0)
    if argv0 is not None and argv0.name in ("cli.py", "__main__.py"):
        return f"{_shell_path(sys.executable)} -m vitdeploy.cli"
    return "vitdeploy"
