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

from .. import __version__
from ..base.errors import ConfigError, RefusedStagesError, VitDeployError, WriteError, first_line
from ..base.memory import human
from ..base.vocab import AUTO, EMBEDDING_DTYPES, EVALUATED_BACKENDS, PRECISIONS, RUNTIME_BACKENDS
from .console import (
    Console,
    ConsoleLogHandler,
    StageReporter,
    artifacts_option,
    export_folder_option,
    file_size,
    fit_path,
    refresh_report,
)

_CONSOLE = Console()


def _fail(message: str, code: int) -> None:
    _CONSOLE.line(f"error: {message}")
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VitDeployError as exc:
            if os.environ.get("VITDEPLOY_DEBUG"):
                raise
            _fail(first_line(exc, MAX_ERROR_LINE), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted; no partial artifact was left under a final name", 130)
        except OSError as exc:  # the disk full, a file over the size limit: the machine's fault, one line
            if exc.errno not in WriteError.ERRNOS or os.environ.get("VITDEPLOY_DEBUG"):
                raise
            _fail(first_line(WriteError.from_os(exc), MAX_ERROR_LINE), WriteError.exit_code)

    return wrapper


MAX_ERROR_LINE = 2000  # values inside a message are already cut at 200; the last guard against a hostile file


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * verbose
    handler = ConsoleLogHandler(_CONSOLE)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=max(level, logging.DEBUG), handlers=[handler])


config_option = click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="pipeline YAML (default: ./pipeline.yaml if present, else built-in defaults)",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vitdeploy")
@click.option("-v", "--verbose", count=True, help="more logging on stderr (-v info, -vv debug)")
def main(verbose: int) -> None:
    """Take a PyTorch Vision Transformer to production: validated ONNX with a dynamic batch, an FP16
    TensorRT engine, a manifest, and one runtime for every backend."""
    _setup_logging(verbose)


revision_option = click.option(
    "--revision",
    default=None,
    help="Hub revision of MODEL: a branch, tag or commit (same as MODEL@revision; default: the repo's main branch)",
)
model_argument = click.argument("model", required=False, metavar="[MODEL]")


@main.command()
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
@handle_errors
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


@main.group("config")
def config_group() -> None:
    """Work with pipeline.yaml."""


@config_group.command("check")
@config_option
@handle_errors
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
@handle_errors
def config_reference() -> None:
    """Print the pipeline.yaml reference (Markdown), generated from the config models: docs/configuration.md."""
    from ..base.config_reference import reference_markdown

    click.echo(reference_markdown(), nl=False)


@main.command()
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
@click.option(
    "--engine",
    type=click.Choice(["auto", "require", "skip"]),
    default="auto",
    show_default=True,
    help="TensorRT engine: build when TensorRT and a CUDA GPU exist (auto), fail without them (require), never (skip)",
)
@handle_errors
def export(
    model: str | None, revision: str | None, config_path: Path | None, out_dir: Path | None, engine: str
) -> None:
    """Export MODEL (a checkpoint file or folder, or a Hugging Face Hub name: org/name[@revision],
    hf-hub:timm/<model>.<tag>; default: model.checkpoint of the config): ONNX, FP16 ONNX, TensorRT engine,
    validation, manifest."""
    from ..base.config import load_config
    from ..export.pipeline import run_export

    cfg = load_config(config_path).with_checkpoint(model, revision)
    click.echo(f"exporting to {out_dir or cfg.output_dir}", err=True)
    try:
        result = run_export(cfg, out_dir, engine=engine, on_stage=StageReporter(_CONSOLE))  # type: ignore[arg-type]
    except RefusedStagesError as exc:  # written without what was refused: list it, then the error line
        _print_export(cfg, exc.result)
        raise
    _print_export(cfg, result)


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


@main.command()
@click.argument(
    "inputs", nargs=-1, required=True, type=click.Path(path_type=Path, readable=False)
)  # each bad path: its own record
@export_folder_option
@click.option(
    "-b",
    "--backend",
    type=click.Choice([AUTO, *RUNTIME_BACKENDS]),
    default=None,
    help="backend (default: runtime.backend from the config, i.e. auto)",
)
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
@config_option
@handle_errors
def predict(
    inputs: tuple[Path, ...],
    artifacts_dir: Path | None,
    backend: str | None,
    top_k: int | None,
    batch_size: int | None,
    as_json: bool,
    patch_tokens: bool,
    image_size: int | None,
    config_path: Path | None,
) -> None:
    """Classify images (files or directories) with the exported model (an embedding model: their vectors)."""
    from ..base.config import load_config
    from ..runtime.batch_predict import predict_paths
    from ..runtime.predictor import Predictor

    cfg = load_config(config_path)
    rt = cfg.runtime
    top_k = top_k or rt.top_k
    predictor = Predictor.from_artifacts(
        artifacts_dir or cfg.output_dir,
        backend=backend or rt.backend,
        options=runtime_options(cfg),
        max_pixels=rt.max_image_pixels,
    ).at_size(image_size)
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
            if as_json:
                click.echo(json.dumps(rec))
            elif "error" in rec:
                click.echo(f"{fit_path(rec['path'], 48):<48} ERROR  {rec['error']}")
            elif "embedding" in rec:
                vector = rec["embedding"]
                head = " ".join(f"{v:.4f}" for v in vector[:4])
                tokens = rec.get("patch_tokens")
                more = (
                    f" + patch tokens [{len(tokens)}, {len(tokens[0]) if tokens else 0}]" if tokens is not None else ""
                )
                click.echo(f"{fit_path(rec['path'], 48):<48} [{head} ...] {len(vector)} values{more}")
            else:
                tops = ", ".join(f"{t['label']}:{t['score']:.3f}" for t in rec["top_k"])
                click.echo(f"{fit_path(rec['path'], 48):<48} {rec['label']:<16} {rec['score']:7.4f}  {tops}")
    if failed:
        click.echo(f"{failed} input(s) could not be read", err=True)
        sys.exit(1)


@main.command("batch-predict")
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
@click.option(
    "-b",
    "--backend",
    type=click.Choice([AUTO, *RUNTIME_BACKENDS]),
    default=None,
    help="backend (default: runtime.backend from the config, i.e. auto)",
)
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
@config_option
@handle_errors
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
    config_path: Path | None,
) -> None:
    """Classify (or embed) image collections on Ray Data: files, folders, globs, list files (.txt/.csv/.parquet),
    URIs. An embedding export writes Parquet: path, embedding (a fixed-size list of floats), error."""
    from ..base.config import load_config
    from ..batch.job import batch_settings_from_config, run_batch

    cfg = load_config(config_path)
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


def runtime_options(cfg: Any) -> Any:
    from ..runtime.backends.base import BackendOptions

    return BackendOptions.from_runtime(cfg.runtime)


@main.command()
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
@click.option("--json", "as_json", is_flag=True, help="print the JSON report on stdout instead of the table")
@config_option
@handle_errors
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
    as_json: bool,
    config_path: Path | None,
) -> None:
    """Measure each backend's drift from eager FP32 PyTorch on real images; exit 3 if any fails.

    An export for several sizes is judged at each of its sizes (--image-size: one). With --url, judge a running
    server (vitdeploy serve, Triton) the same way: exit 3 when its answers fail the thresholds or it runs
    another export than -a, 4 when it does not answer."""
    from ..base.config import load_config
    from ..evaluate.drift import format_drift_table, run_drift

    cfg = load_config(config_path)
    if images is None and labels_file is None:
        images = cfg.resolve(cfg.validation.images)
    if url is not None:
        if backends is not None:
            raise ConfigError("--backends names in-process backends; with --url, --backend names the thresholds")
        return _validate_url(
            cfg, artifacts_dir, url, protocol, model, backend, images, labels_file, as_json, image_size
        )
    if protocol or model or backend:
        raise ConfigError("--protocol, --model and --backend judge a running server: they go with --url URL")
    report = run_drift(
        artifacts_dir,
        images=images,
        labels_file=labels_file,
        backends=backends,
        thresholds={key: getattr(cfg.validation, key) for key in PRECISIONS},
        options=runtime_options(cfg),
        max_pixels=cfg.runtime.max_image_pixels,
        image_size=image_size,
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in format_drift_table(report):
            click.echo(line)
    if report.report_path and Path(report.report_path).parent == Path(artifacts_dir):
        refresh_report(artifacts_dir)  # the page's accuracy section follows the new drift report
    report.raise_for_failures()


def _validate_url(
    cfg: Any,
    artifacts_dir: Path,
    url: str,
    protocol: str | None,
    model: str | None,
    backend: str | None,
    images: Path | None,
    labels_file: Path | None,
    as_json: bool,
    image_size: int | None = None,
) -> None:
    """`validate --url`: the server's answers judged against eager PyTorch (tune/served_check.py)."""
    from ..evaluate.served_report import format_served
    from ..serve.auth import read_token
    from ..tune.served_check import check_served

    token_file = cfg.resolve(Path(cfg.serve.token_file)) if cfg.serve.token_file else None
    check = check_served(
        artifacts_dir,
        url,
        protocol=protocol or "predict",
        model=model,
        token=read_token(token_file),
        images=images,
        labels_file=labels_file,
        backend=backend,
        thresholds={key: getattr(cfg.validation, key) for key in PRECISIONS},
        options=runtime_options(cfg),
        max_pixels=cfg.runtime.max_image_pixels,
        image_size=image_size,
    )
    if as_json:
        click.echo(json.dumps(check.to_dict(), indent=2))
    else:
        for line in format_served(check):
            click.echo(line)
    if check.report_path and Path(check.report_path).parent == Path(artifacts_dir):
        refresh_report(artifacts_dir)  # the report page shows the served row beside the in-process backends
    check.raise_for_failures()


@main.command()
@artifacts_option
@click.option(
    "-b",
    "--backends",
    default=None,
    help=f"comma-separated backends: {','.join(EVALUATED_BACKENDS)} (default: all that can run here; "
    "eager torch on the CPU always runs as the baseline)",
)
@click.option("--batch-sizes", default="1,8,32", show_default=True, help="comma-separated batch sizes")
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="timed calls per backend and batch size",
)
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="untimed calls first")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="intra-op threads (default: runtime.threads, else the libraries' default)",
)
@click.option(
    "--end-to-end", is_flag=True, help="time image files through the Predictor: preprocess + inference + postprocess"
)
@click.option(
    "--images",
    type=click.Path(path_type=Path),
    default=None,
    help="images for --end-to-end (default: the demo images)",
)
@click.option("--json", "as_json", is_flag=True, help="print the JSON report on stdout instead of the table")
@config_option
@handle_errors
def bench(
    artifacts_dir: Path,
    backends: str | None,
    batch_sizes: str,
    iterations: int,
    warmup: int,
    threads: int | None,
    end_to_end: bool,
    images: Path | None,
    as_json: bool,
    config_path: Path | None,
) -> None:
    """Latency p50/p90/p99 and images/s per backend and batch size, as ratios to eager PyTorch."""
    from ..base.config import load_config
    from ..evaluate.bench import format_bench_table, run_bench

    cfg = load_config(config_path)
    report = run_bench(
        artifacts_dir,
        backends=backends,
        batch_sizes=batch_sizes,
        iterations=iterations,
        warmup=warmup,
        threads=threads,
        end_to_end=end_to_end,
        images=images,
        options=runtime_options(cfg),
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in format_bench_table(report):
            click.echo(line)
    if not end_to_end:  # saved beside the manifest: `vitdeploy report` reads it
        from ..evaluate.report import save_bench
        from ..evaluate.report.facts import BENCH_REPORT_NAME

        try:
            save_bench(Path(artifacts_dir) / BENCH_REPORT_NAME, report.to_dict())
        except OSError as exc:
            click.echo(f"bench report not saved: {exc}", err=True)
        else:
            refresh_report(artifacts_dir)


@main.command("report")
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
@config_option
@handle_errors
def report_cmd(
    artifacts_dir: Path,
    out_path: Path | None,
    bench_mode: str,
    no_images: bool,
    as_json: bool,
    config_path: Path | None,
) -> None:
    """One self-contained HTML page: accuracy and speed of every backend here, and what to deploy."""
    from ..evaluate.report import write_report

    path, rec, facts = write_report(artifacts_dir, out_path, bench=bench_mode, images=not no_images)
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


@main.command()
@click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    default=None,
    help="directory written by `vitdeploy export` (default: export.output_dir from the config); with "
    "--write-config also a file:// s3:// or gs:// URI",
)
@click.option(
    "-b",
    "--backend",
    type=click.Choice([AUTO, *RUNTIME_BACKENDS]),
    default=None,
    help="backend (default: runtime.backend from the config, i.e. auto)",
)
@click.option("--host", default=None, help="address to listen on (default: serve.host, 127.0.0.1)")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="HTTP port (default: serve.port, 8000)")
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="replicas (default: serve.replicas, 1)")
@click.option(
    "--address",
    default=None,
    help="join this Ray cluster (e.g. auto, or ray://head:10001) instead of starting a local Ray",
)
@click.option("--access-log", is_flag=True, help="log every request (Ray Serve's access log)")
@click.option(
    "--allow-unauthenticated",
    is_flag=True,
    help="listen on a non-loopback --host without a serve token (VITDEPLOY_SERVE_TOKEN or serve.token_file)",
)
@click.option(
    "--allow-insecure",
    is_flag=True,
    help="send the serve token over plain HTTP (or gRPC) on a non-loopback --host: a TLS-terminating ingress "
    "is in front (else set serve.tls)",
)
@click.option(
    "--name",
    default=None,
    help="the model's name and route /v2/models/<name> (default: serve.name, "
    "else the manifest's name); several models can be served on one cluster under their names",
)
@click.option(
    "--write-config",
    "write_config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write a Ray Serve config for `serve deploy` (artifacts from -a: a path or file:// s3:// gs:// URI) and exit",
)
@click.option(
    "--write-rayservice",
    "write_rayservice",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write a KubeRay RayService manifest with that config and exit",
)
@config_option
@handle_errors
def serve(
    artifacts_dir: str | None,
    backend: str | None,
    host: str | None,
    port: int | None,
    replicas: int | None,
    address: str | None,
    access_log: bool,
    allow_unauthenticated: bool,
    allow_insecure: bool,
    name: str | None,
    write_config: Path | None,
    write_rayservice: Path | None,
    config_path: Path | None,
) -> None:
    """Serve the model over HTTP on Ray Serve: POST /predict, the KServe v2 protocol, dynamic batching.

    With a token (VITDEPLOY_SERVE_TOKEN, or the file serve.token_file names) every model route needs
    Authorization: Bearer <token>; a non-loopback --host without one is refused unless
    --allow-unauthenticated; with a token, plain HTTP there is refused unless serve.tls or --allow-insecure."""
    from ..base.config import load_config
    from ..serve import tls
    from ..serve.auth import digest, read_token
    from ..serve.runner import LOOPBACK, ServeSettings, run_server

    cfg = load_config(config_path)
    sv = cfg.serve
    token = read_token(cfg.resolve(sv.token_file) if sv.token_file else None)
    exposed = write_rayservice is not None or (host or sv.host) not in LOOPBACK
    if exposed and token is None and not allow_unauthenticated:
        where = "the RayService (0.0.0.0)" if write_rayservice and not write_config else f"--host {host or sv.host}"
        raise ConfigError(
            f"{where} lets anyone who reaches the port call the model: set VITDEPLOY_SERVE_TOKEN (or "
            f"serve.token_file) to require a token, or pass --allow-unauthenticated"
        )
    tls.check_files(cfg)
    where = "the RayService (0.0.0.0)" if write_rayservice and (host or sv.host) in LOOPBACK else None
    tls.check_transport(cfg, host or sv.host, exposed, token is not None, allow_insecure, where)
    source = artifacts_dir if artifacts_dir and "://" in artifacts_dir else Path(artifacts_dir or cfg.output_dir)
    settings = ServeSettings(
        artifacts=source,
        backend=backend or cfg.runtime.backend,
        host=host or sv.host,
        port=port or sv.port,
        replicas=replicas or sv.replicas,
        address=address,
        access_log=access_log,
        name=name,
        token_digest=digest(token) if token else None,
    )
    if write_config or write_rayservice:
        from ..serve.deploy_config import write_deploy_files

        for path in write_deploy_files(cfg, settings, config_path=write_config, rayservice_path=write_rayservice):
            click.echo(f"wrote {path}", err=True)
        return
    run_server(cfg, settings, runtime_options(cfg), progress=lambda line: click.echo(line, err=True))


@main.command("triton-repo")
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
@config_option
@handle_errors
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
    config_path: Path | None,
) -> None:
    """Generate a Triton model repository (ensemble: image bytes -> logits + top-k) from an export."""
    from ..base.config import load_config
    from ..base.errors import ConfigError
    from ..serve.triton.new_version import add_version
    from ..serve.triton.repo import build_triton_repo, settings_from_config

    if force and new_version:
        raise ConfigError("--force replaces OUT, --new-version adds to it: pass one of them")

    cfg = load_config(config_path)
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
    from ..base.errors import ConfigError

    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} expects comma-separated integers, got {text!r}") from None


def _register(*commands: click.Command) -> None:
    """Commands defined in their own module: each gets the one error handler here."""
    for command in commands:
        command.callback = handle_errors(command.callback)
        main.add_command(command)


from .load import loadtest, tune  # noqa: E402 - registered after main exists
from .rollout import rollout  # noqa: E402

_register(loadtest, tune, rollout)

if __name__ == "__main__":  # pragma: no cover
    main()
