"""`vitdeploy bench`: latency and throughput per backend and batch size, saved beside the export for its report."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..base.vocab import EVALUATED_BACKENDS
from .console import refresh_report
from .options import artifacts_option, config_option, runtime_options


@click.command("bench")
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
    from ..evaluate.bench import run_bench
    from ..evaluate.bench_report import format_bench_table

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
        from ..base.vocab import BENCH_REPORT_NAME
        from ..evaluate.report import save_bench

        try:
            save_bench(Path(artifacts_dir) / BENCH_REPORT_NAME, report.to_dict())
        except OSError as exc:
            click.echo(f"bench report not saved: {exc}", err=True)
        else:
            refresh_report(artifacts_dir)
