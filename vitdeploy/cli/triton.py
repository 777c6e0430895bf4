"""`vitdeploy triton-repo`: a Triton model repository from an export, or (``--new-version``) the export added to
one as its next version."""

from __future__ import annotations

from pathlib import Path

import click

from ..base.errors import ConfigError
from .options import ModalCommand, Modes, config_option, export_folder_option
from .sign import verify_key_option

#: --new-version adds to OUT; --force (replace OUT) goes only without it.
MODES = Modes(
    switch="new_version",
    unswitched=("force",),
    unswitched_error="--force replaces OUT, --new-version adds to it: pass one of them",
)


@click.command("triton-repo", cls=ModalCommand, modes=MODES)
@export_folder_option
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="the model repository to write (replaced only with --force, once the new one is complete)",
)
@click.option(
    "--inference",
    type=click.Choice(["auto", "onnx", "trt", "ort_python", "openvino"]),
    default=None,
    help="model the ensemble calls (default: triton.inference, i.e. auto: trt with an engine, else onnx; openvino: "
    "Triton's OpenVINO backend on the CPU)",
)
@click.option(
    "--instances", type=click.IntRange(min=1), default=None, help="inference model instances (triton.instances)"
)
@click.option(
    "--kind",
    type=click.Choice(["auto", "gpu", "cpu"]),
    default=None,
    help="inference model instance kind (triton.kind)",
)
@click.option("--gpus", default=None, help="comma-separated GPU ids for the inference model (triton.gpus)")
@click.option(
    "--preprocess-instances",
    type=click.IntRange(min=1),
    default=None,
    help="decoding instances (triton.preprocess_instances)",
)
@click.option(
    "-k",
    "--top-k",
    type=click.IntRange(min=1),
    default=None,
    help="K of TOPK_LABELS/TOPK_SCORES (default: serve.top_k, 5)",
)
@click.option("--force", is_flag=True, help="replace OUT if it exists")
@click.option(
    "--new-version",
    is_flag=True,
    help="add the export as the next version folder of every model of the repository OUT (same model; the "
    "live version untouched, the ensemble then calls the new one: see OUT/README.md for the switch)",
)
@verify_key_option
@config_option
def triton_repo(
    artifacts_dir: Path | None,
    out_dir: Path,
    inference: str | None,
    instances: int | None,
    kind: str | None,
    gpus: str | None,
    preprocess_instances: int | None,
    top_k: int | None,
    force: bool,
    new_version: bool,
    verify_key: Path | None,
    config_path: Path | None,
) -> None:
    """Generate a Triton model repository (ensemble: image bytes -> logits + top-k) from an export."""
    from ..base.config import load_config
    from ..serve.triton.new_version import add_version
    from ..serve.triton.repo import build_triton_repo, settings_from_config

    cfg = load_config(config_path).with_verify_key(verify_key)
    overrides = {
        "inference": inference,
        "instances": instances,
        "kind": kind,
        "preprocess_instances": preprocess_instances,
        "gpus": _int_list(gpus, "--gpus") if gpus is not None else None,
    }
    settings = settings_from_config(cfg, {k: v for k, v in overrides.items() if v is not None}, top_k=top_k)
    step = lambda msg: click.echo(f"  {msg} ...", err=True)  # noqa: E731
    if new_version:
        result = add_version(artifacts_dir or cfg.output_dir, out_dir, settings, on_step=step)
        click.echo(
            f"added version {result.version} to {result.path}: {', '.join(result.models)} (ensemble "
            f"'{result.name}' now calls version {result.version} of {result.name}_{result.inference}; the server "
            f"runs version {result.previous} until you load it)"
        )
        click.echo(f"next: the switch on a running server is in {result.path / 'README.md'} (A new version)")
        return
    result = build_triton_repo(artifacts_dir or cfg.output_dir, out_dir, settings, force=force, on_step=step)
    click.echo(
        f"wrote {result.path}: {', '.join(result.models)} (ensemble '{result.name}' over "
        f"{result.name}_{result.inference})"
    )
    click.echo(f"next: see {result.path / 'README.md'} for the docker run line and a tritonclient example")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} expects comma-separated integers, got {text!r}") from None
