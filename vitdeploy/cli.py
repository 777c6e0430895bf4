"""The `vitdeploy` command. It only parses, calls one library function per command, and prints.

Every VitDeployError becomes one line on stderr and its exit code (2 usage/config, 3 validation
failed, 4 required stage unavailable, 1 other); a user never sees a traceback for their own
mistake (``VITDEPLOY_DEBUG=1`` shows it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__
from .errors import VitDeployError


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VitDeployError as exc:
            if os.environ.get("VITDEPLOY_DEBUG"):
                raise
            _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted; no partial artifact was left under a final name", 130)

    return wrapper


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


config_option = click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                             help="pipeline YAML (default: ./pipeline.yaml if present, else built-in defaults)")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vitdeploy")
@click.option("-v", "--verbose", count=True, help="more logging on stderr (-v info, -vv debug)")
def main(verbose: int) -> None:
    """Take a PyTorch Vision Transformer to production: validated ONNX with a dynamic batch, an FP16
    TensorRT engine, a manifest, and one runtime for every backend."""
    _setup_logging(verbose)


@main.command()
@handle_errors
def info() -> None:
    """Library versions, ONNX Runtime providers, CUDA devices, and which backends can run here."""
    from .environment import environment_report

    for line in environment_report():
        click.echo(line)


@main.group("config")
def config_group() -> None:
    """Work with pipeline.yaml."""


@config_group.command("check")
@config_option
@handle_errors
def config_check(config_path: Path | None) -> None:
    """Validate a pipeline YAML and print the effective configuration."""
    from .config import load_config

    cfg = load_config(config_path)
    click.echo(f"{cfg.source or 'built-in defaults'}: OK")
    click.echo(json.dumps(cfg.model_dump(mode="json", exclude={"source"}), indent=2))


@main.command()
@config_option
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory (default: export.output_dir from the config)")
@click.option("--engine", type=click.Choice(["auto", "require", "skip"]), default="auto", show_default=True,
              help="TensorRT engine: build when TensorRT and a CUDA GPU exist (auto), fail without them (require), never (skip)")
@handle_errors
def export(config_path: Path | None, out_dir: Path | None, engine: str) -> None:
    """Export the configured checkpoint: ONNX, FP16 ONNX, TensorRT engine, validation, manifest."""
    from .config import load_config
    from .export.pipeline import run_export

    cfg = load_config(config_path)

    def on_stage(rec: Any) -> None:
        if rec.status == "running":
            click.echo(f"  {rec.name:<22} ...", err=True)
            return
        sizes = ", ".join(f"{p.name} {_size(p)}" for p in rec.outputs if p.exists())
        detail = " ".join(x for x in (sizes, rec.reason) if x)
        click.echo(f"  {rec.name:<22} {rec.status:<8} {rec.seconds:7.1f}s  {detail}", err=True)

    click.echo(f"exporting to {out_dir or cfg.output_dir}", err=True)
    result = run_export(cfg, out_dir, engine=engine, on_stage=on_stage)  # type: ignore[arg-type]
    click.echo("artifacts:")
    for role, path in result.artifacts.items():
        click.echo(f"  {role:<15} {path}  ({_size(path)})")
    click.echo(f"  {'manifest':<15} {result.manifest_path}")
    click.echo(f"next: vitdeploy predict {_demo_hint(cfg)} -a {result.out_dir}")


def _demo_hint(cfg: Any) -> str:
    from .paths import DEMO_IMAGES_DIR

    return str(cfg.resolve(cfg.validation.images) or DEMO_IMAGES_DIR)


def _size(path: Path) -> str:
    n = path.stat().st_size
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-a", "--artifacts", "artifacts_dir", type=click.Path(path_type=Path), default=None,
              help="directory written by `vitdeploy export` (default: export.output_dir from the config)")
@click.option("-b", "--backend", type=click.Choice(["auto", "torch", "ort", "ort-fp16", "trt"]), default=None,
              help="backend (default: runtime.backend from the config, i.e. auto)")
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=None, help="default: runtime.top_k (5)")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="default: runtime.batch_size (32)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line per input on stdout")
@config_option
@handle_errors
def predict(inputs: tuple[Path, ...], artifacts_dir: Path | None, backend: str | None, top_k: int | None,
            batch_size: int | None, as_json: bool, config_path: Path | None) -> None:
    """Classify images (files or directories) with the exported model."""
    from .config import load_config
    from .runtime.batch_predict import predict_paths
    from .runtime.predictor import Predictor

    cfg = load_config(config_path)
    rt = cfg.runtime
    top_k = top_k or rt.top_k
    predictor = Predictor.from_artifacts(artifacts_dir or cfg.output_dir, backend=backend or rt.backend,
                                         options=runtime_options(cfg), max_pixels=rt.max_image_pixels)
    click.echo(f"backend: {predictor.backend_name} ({predictor.why})", err=True)
    failed = 0
    show_progress = not as_json and sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if total >= 64 and (show_progress or as_json):
            click.echo(f"\r  {done}/{total} images", err=True, nl=done == total)

    if not as_json:
        click.echo(f"{'path':<48} {'label':<16} {'score':>7}  top-{top_k}")
    with predictor:
        for rec in predict_paths(predictor, list(inputs), batch_size=batch_size or rt.batch_size, top_k=top_k,
                                 progress=progress):
            failed += "error" in rec
            if as_json:
                click.echo(json.dumps(rec))
            elif "error" in rec:
                click.echo(f"{_short(rec['path']):<48} ERROR  {rec['error']}")
            else:
                tops = ", ".join(f"{t['label']}:{t['score']:.3f}" for t in rec["top_k"])
                click.echo(f"{_short(rec['path']):<48} {rec['label']:<16} {rec['score']:7.4f}  {tops}")
    if failed:
        click.echo(f"{failed} input(s) could not be read", err=True)
        sys.exit(1)


def _short(path: str, width: int = 48) -> str:
    return path if len(path) <= width else "…" + path[-(width - 1):]


def runtime_options(cfg: Any) -> Any:
    from .runtime.backends.base import BackendOptions

    rt = cfg.runtime
    return BackendOptions(device=rt.device, providers=tuple(rt.providers), allow_cpu_fallback=rt.allow_cpu_fallback,
                          threads=rt.threads, extra={"ort_allow_spinning": rt.ort_allow_spinning})


@main.command()
@click.option("-a", "--artifacts", "artifacts_dir", type=click.Path(path_type=Path), default=Path("artifacts"), show_default=True,
              help="directory written by `vitdeploy export`")
@click.option("--images", type=click.Path(path_type=Path), default=None,
              help="folder of validation images (default: validation.images from the config, else the demo images)")
@click.option("--labels", "labels_file", type=click.Path(path_type=Path), default=None,
              help="CSV 'path,label' (paths relative to the CSV or the images folder); default: IMAGES/labels.csv, "
                   "else sub-folder names")
@click.option("-b", "--backends", default=None,
              help="comma-separated backends: torch,ort,ort-fp16,torch-fp16,trt (default: all; those that cannot run "
                   "here are listed with the reason)")
@click.option("--json", "as_json", is_flag=True, help="print the JSON report on stdout instead of the table")
@config_option
@handle_errors
def validate(artifacts_dir: Path, images: Path | None, labels_file: Path | None, backends: str | None, as_json: bool,
             config_path: Path | None) -> None:
    """Measure each backend's drift from eager FP32 PyTorch on real images; exit 3 if any fails."""
    from .config import load_config
    from .drift import format_drift_table, run_drift

    cfg = load_config(config_path)
    if images is None and labels_file is None:
        images = cfg.resolve(cfg.validation.images)
    report = run_drift(artifacts_dir, images=images, labels_file=labels_file, backends=backends,
                       thresholds={"fp32": cfg.validation.fp32, "fp16": cfg.validation.fp16},
                       options=runtime_options(cfg), max_pixels=cfg.runtime.max_image_pixels)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in format_drift_table(report):
            click.echo(line)
    report.raise_for_failures()


@main.command()
@click.option("-a", "--artifacts", "artifacts_dir", type=click.Path(path_type=Path), default=Path("artifacts"), show_default=True,
              help="directory written by `vitdeploy export`")
@click.option("-b", "--backends", default=None,
              help="comma-separated backends: torch,ort,ort-fp16,torch-fp16,trt (default: all that can run here; "
                   "eager torch on the CPU always runs as the baseline)")
@click.option("--batch-sizes", default="1,8,32", show_default=True, help="comma-separated batch sizes")
@click.option("--iterations", type=click.IntRange(min=1), default=20, show_default=True, help="timed calls per backend and batch size")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="untimed calls first")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="intra-op threads (default: runtime.threads, else the libraries' default)")
@click.option("--end-to-end", is_flag=True, help="time image files through the Predictor: preprocess + inference + postprocess")
@click.option("--images", type=click.Path(path_type=Path), default=None, help="images for --end-to-end (default: the demo images)")
@click.option("--json", "as_json", is_flag=True, help="print the JSON report on stdout instead of the table")
@config_option
@handle_errors
def bench(artifacts_dir: Path, backends: str | None, batch_sizes: str, iterations: int, warmup: int, threads: int | None,
          end_to_end: bool, images: Path | None, as_json: bool, config_path: Path | None) -> None:
    """Latency p50/p90/p99 and images/s per backend and batch size, as ratios to eager PyTorch."""
    from .bench import format_bench_table, run_bench
    from .config import load_config

    cfg = load_config(config_path)
    report = run_bench(artifacts_dir, backends=backends, batch_sizes=batch_sizes, iterations=iterations, warmup=warmup,
                       threads=threads, end_to_end=end_to_end, images=images, options=runtime_options(cfg))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in format_bench_table(report):
            click.echo(line)


@main.command("triton-repo")
@click.option("-a", "--artifacts", "artifacts_dir", type=click.Path(path_type=Path), default=None,
              help="directory written by `vitdeploy export` (default: export.output_dir from the config)")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="the model repository to write (replaced only with --force, once the new one is complete)")
@click.option("--inference", type=click.Choice(["auto", "onnx", "trt", "ort_python"]), default=None,
              help="model the ensemble calls (default: triton.inference, i.e. auto: trt with an engine, else onnx)")
@click.option("--instances", type=click.IntRange(min=1), default=None, help="inference model instances (triton.instances)")
@click.option("--kind", type=click.Choice(["auto", "gpu", "cpu"]), default=None, help="inference model instance kind (triton.kind)")
@click.option("--gpus", default=None, help="comma-separated GPU ids for the inference model (triton.gpus)")
@click.option("--preprocess-instances", type=click.IntRange(min=1), default=None, help="decoding instances (triton.preprocess_instances)")
@click.option("-k", "--top-k", type=click.IntRange(min=1), default=None, help="K of TOPK_LABELS/TOPK_SCORES (default: serve.top_k, 5)")
@click.option("--force", is_flag=True, help="replace OUT if it exists")
@config_option
@handle_errors
def triton_repo(artifacts_dir: Path | None, out_dir: Path, inference: str | None, instances: int | None,
                kind: str | None, gpus: str | None, preprocess_instances: int | None, top_k: int | None, force: bool,
                config_path: Path | None) -> None:
    """Generate a Triton model repository (ensemble: image bytes -> logits + top-k) from an export."""
    from .config import load_config
    from .serve.triton_repo import build_triton_repo, settings_from_config

    cfg = load_config(config_path)
    overrides = {"inference": inference, "instances": instances, "kind": kind, "preprocess_instances": preprocess_instances,
                 "gpus": _int_list(gpus, "--gpus") if gpus is not None else None}
    settings = settings_from_config(cfg, {k: v for k, v in overrides.items() if v is not None}, top_k=top_k)
    result = build_triton_repo(artifacts_dir or cfg.output_dir, out_dir, settings, force=force,
                               on_step=lambda msg: click.echo(f"  {msg} ...", err=True))
    click.echo(f"wrote {result.path}: {', '.join(result.models)} (ensemble '{result.name}' over {result.name}_{result.inference})")
    click.echo(f"next: see {result.path / 'README.md'} for the docker run line and a tritonclient example")


def _int_list(text: str, flag: str) -> list[int]:
    from .errors import ConfigError

    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} expects comma-separated integers, got {text!r}") from None


if __name__ == "__main__":  # pragma: no cover
    main()
