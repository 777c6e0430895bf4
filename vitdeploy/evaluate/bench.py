"""`vitdeploy bench`: latency and throughput of every backend, as ratios to eager PyTorch.

    report = run_bench("artifacts/", batch_sizes=(1, 8, 32), iterations=50)
    print("\\n".join(format_bench_table(report)))      # bench_report.py

For each batch size the backends run **interleaved** in one process: after a warm-up, each
iteration runs every backend once (the starting backend rotates every iteration), so a noisy
machine (frequency scaling, a neighbour's job) slows all of them alike and the ratios hold.
Per backend and batch size: latency p50 / p90 / p99 and images per second, and the speed as a
ratio to eager FP32 PyTorch on the CPU (the baseline, always run). CPU backends are timed with
``time.perf_counter``; backends on a CUDA GPU (``torch`` on cuda, ``torch-fp16``, ``trt``) with
CUDA events (``torch.cuda.Event``) around a synchronised call.

End-to-end mode times what a user of :class:`~vitdeploy.runtime.predictor.Predictor` sees on
image files (the demo images by default): preprocessing, inference and postprocessing, each
timed with the wall clock, and reports the share spent in each.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..base.errors import ConfigError, InputError
from ..base.limits import check_batch_size, clip
from ..base.machine import cpu_key, cpu_model
from ..export.manifest import library_versions
from ..runtime.backends import first_line
from .bench_report import BASELINE, PHASES, BenchReport, attach_ratios
from .reliability import busy_machine_reason, contention, mark_unreliable, sample, usable_cores
from .specs import BackendSpec, backend_specs, parse_backend_names, reference_options, try_open_spec
from .timing import BenchResult, LatencyStats, cuda_event_timer, measure, percentile, speed_ratio, summarize  # noqa: F401

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 8, 32)


def environment(threads: int | None = None) -> dict[str, Any]:
    """What the numbers depend on: CPU, threads, GPU, library versions."""
    env: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_key": cpu_key(),  # the CPU's model and flags: auto takes a bench's figures taken on this CPU only
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "threads_requested": threads,
        "cpu_affinity": usable_cores(),
    }
    env["gpus"] = []
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                env["gpus"].append(f"cuda:{i} {p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)")
    except ImportError:
        pass
    try:
        from ..runtime.backends.ort import available_providers

        env["onnxruntime_providers"] = available_providers()
    except ImportError:  # pragma: no cover
        env["onnxruntime_providers"] = []
    env["versions"] = library_versions()
    return env


def parse_batch_sizes(value: str | Sequence[int]) -> tuple[int, ...]:
    """ "1,8,32" -> (1, 8, 32); ConfigError for anything but positive integers."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"--batch-sizes: {clip(text)} is not a positive integer; expected e.g. 1,8,32")
        out.append(check_batch_size(n, "--batch-sizes:"))
    if not out:
        raise ConfigError("--batch-sizes: no batch size given; expected e.g. 1,8,32")
    return tuple(dict.fromkeys(out))


def _bench_specs(requested: tuple[str, ...] | None, options: Any) -> list[BackendSpec]:
    """The backends asked for, with the eager CPU baseline always among them (first)."""
    specs = backend_specs(requested, options)
    if not any(s.is_reference for s in specs):
        base = BackendSpec(BASELINE, "torch", reference_options(options), "fp32")
        specs = [base] + [
            dataclasses.replace(s, name=f"{s.name}-{s.options.device}") if s.name == BASELINE else s for s in specs
        ]
    else:
        specs.sort(key=lambda s: not s.is_reference)
    return specs


def run_bench(
    artifacts_dir: str | os.PathLike[str] | Any,
    *,
    backends: str | Sequence[str] | None = None,
    batch_sizes: str | Sequence[int] = DEFAULT_BATCH_SIZES,
    iterations: int = 20,
    warmup: int = 3,
    threads: int | None = None,
    end_to_end: bool = False,
    images: str | os.PathLike[str] | None = None,
    options: Any = None,
    seed: int = 0,
) -> BenchReport:
    """Benchmark the backends that can run here (or those named) at each batch size.

    ``options``: BackendOptions (device, providers); ``threads`` overrides its intra-op thread
    count (torch's is process-wide). ``end_to_end``: time image files through the Predictor
    (``images``: a folder or file; default the demo images) instead of preprocessed tensors.
    Backends that cannot run here are listed with the reason; one that fails to open or run is
    listed as an error and the others go on.
    """
    from ..runtime.artifacts import Artifacts
    from ..runtime.backends import BackendOptions

    if int(iterations) < 1:
        raise ConfigError(f"--iterations must be >= 1, got {iterations}")
    if int(warmup) < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup}")
    if threads is not None and int(threads) < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    sizes = parse_batch_sizes(batch_sizes)
    options = options or BackendOptions()
    # Every backend gets the same intra-op thread count, so a ratio compares runtimes, not threads.
    options = dataclasses.replace(
        options, threads=int(threads) if threads is not None else options.threads or _default_threads()
    )
    requested = parse_backend_names(backends)
    artifacts = Artifacts.open(artifacts_dir)
    specs = _bench_specs(requested, options)

    rows, opened, spec_of = _open_backends(specs, artifacts)

    def on_error(name: str, exc: BaseException) -> None:
        for row in rows:
            if row["name"] == name:
                row.update(status="error", reason=f"failed to run: {first_line(exc)}")
        log.warning("%s: %s", name, first_line(exc))

    results: list[BenchResult] = []
    before = sample()  # the timed window starts once every backend is open
    try:
        timers = (
            {name: cuda_event_timer(spec_of[name].options.device) for name in opened if spec_of[name].uses_cuda}
            if not end_to_end
            else {}
        )
        if end_to_end:
            results = _bench_end_to_end(artifacts, opened, sizes, int(iterations), int(warmup), images, on_error)
        else:
            results = _bench_inference(
                artifacts, opened, rows, sizes, int(iterations), int(warmup), timers, on_error, seed
            )
    finally:
        for backend in opened.values():
            backend.close()
    window = contention(before, sample(), usable_cores())
    attach_ratios(results)
    mark_unreliable(results, busy_machine_reason(window, options.threads), BASELINE)
    settings = {
        "batch_sizes": list(sizes),
        "iterations": int(iterations),
        "warmup": int(warmup),
        "threads": options.threads,
        "device": options.device,
        "providers": list(options.providers),
        "requested": list(requested) if requested else None,
        "interleaved": True,
        "seed": seed,
    }
    env = {**environment(options.threads), "contention": window.to_dict() if window else None}
    return BenchReport(
        artifacts=str(artifacts.directory),
        model=artifacts.name,
        mode="end-to-end" if end_to_end else "inference",
        settings=settings,
        environment=env,
        backends=rows,
        results=results,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


def _open_backends(
    specs: Sequence[BackendSpec], artifacts: Any
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, BackendSpec]]:
    """(one report row per spec, the backends that opened by name, their specs by name)."""
    rows: list[dict[str, Any]] = []
    opened: dict[str, Any] = {}
    spec_of: dict[str, BackendSpec] = {}
    for spec in specs:
        row = {
            "name": spec.name,
            "precision": spec.precision,
            "device": spec.options.device,
            "baseline": spec.is_reference,
            "status": "ran",
            "reason": "",
            "describe": "",
        }
        rows.append(row)
        attempt = try_open_spec(spec, artifacts)  # a tampered file is an error, never a skip
        if attempt.status == "unavailable":
            row.update(status="unavailable", reason=attempt.reason)
            continue
        if attempt.backend is None:
            row.update(status="error", reason=f"cannot open: {attempt.reason}")
            continue
        row["describe"] = attempt.backend.describe()
        opened[spec.name] = attempt.backend
        spec_of[spec.name] = spec
    return rows, opened, spec_of


def _bench_inference(
    artifacts: Any,
    opened: dict[str, Any],
    rows: list[dict[str, Any]],
    sizes: Sequence[int],
    iterations: int,
    warmup: int,
    timers: dict[str, Any],
    on_error: Any,
    seed: int,
) -> list[BenchResult]:
    """Every open backend on the same seeded random batch at each size, interleaved."""
    results: list[BenchResult] = []
    rng = np.random.default_rng(seed)
    for size in sizes:
        batch = rng.standard_normal((size, *artifacts.input_shape)).astype(np.float32)
        live = {n: b for n, b in opened.items() if _status(rows, n) == "ran"}
        runners = {n: (lambda b=b: b.run(batch)) for n, b in live.items()}
        times = measure(runners, iterations=iterations, warmup=warmup, timers=timers, on_error=on_error)
        for name, secs in times.items():
            if secs and _status(rows, name) == "ran":
                timer = "cuda-events" if name in timers else "perf_counter"
                results.append(BenchResult(name, size, summarize(secs, size), timer))
        log.info("batch %d done", size)
    return results


def _default_threads() -> int:
    """torch's intra-op thread count (which honours OMP_NUM_THREADS), else one per usable core."""
    try:
        import torch
    except ImportError:
        return usable_cores()
    return torch.get_num_threads()


def _status(rows: list[dict[str, Any]], name: str) -> str:
    return next((r["status"] for r in rows if r["name"] == name), "unknown")


def _image_files(images: str | os.PathLike[str] | None) -> list[Path]:
    from ..demo import IMAGES_DIR as DEMO_IMAGES_DIR
    from ..runtime.image_paths import iter_image_paths

    root = Path(images) if images is not None else DEMO_IMAGES_DIR
    if not root.exists():
        raise InputError(f"--images {root}: no such file or directory")
    return iter_image_paths([root])


def _bench_end_to_end(
    artifacts: Any,
    opened: Mapping[str, Any],
    sizes: Sequence[int],
    iterations: int,
    warmup: int,
    images: str | os.PathLike[str] | None,
    on_error: Callable[[str, BaseException], None],
) -> list[BenchResult]:
    """Time preprocess + inference + postprocess through a Predictor per backend, interleaved."""
    from ..runtime.predictor import Predictor

    files = _image_files(images)
    predictors = {name: Predictor(artifacts, backend, backend_name=name) for name, backend in opened.items()}
    if not predictors:
        return []
    any_pred = next(iter(predictors.values()))
    _, good, errors = any_pred.preprocessor.batch_tolerant(files)
    if errors:
        log.warning(
            "end-to-end: %d unreadable image(s) left out (first: %s)", len(errors), next(iter(errors.values()))
        )
    files = [files[i] for i in good]
    if not files:
        raise InputError("end-to-end benchmark: no readable image among the inputs")

    results = []
    for size in sizes:
        chunk = list(itertools.islice(itertools.cycle(files), size))
        phases: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in predictors}

        def runner(name: str) -> Callable[[], None]:
            pred = predictors[name]

            def run() -> None:
                t0 = time.perf_counter()
                batch = pred.preprocess(chunk)
                t1 = time.perf_counter()
                logits = pred.predict_logits(batch)
                t2 = time.perf_counter()
                pred.predictions_from_logits(logits, top_k=5)
                t3 = time.perf_counter()
                rec = phases[name]
                rec["preprocess"].append(t1 - t0)
                rec["inference"].append(t2 - t1)
                rec["postprocess"].append(t3 - t2)

            return run

        runners = {n: runner(n) for n in predictors}
        measure(runners, iterations=warmup, warmup=0, on_error=on_error)  # warm-up, phases discarded
        for rec in phases.values():
            for p in PHASES:
                rec[p].clear()
        times = measure(runners, iterations=iterations, warmup=0, on_error=on_error)
        for name, secs in times.items():
            rec = phases[name]
            if not secs or len(rec["preprocess"]) != len(secs):
                continue
            total = sum(sum(rec[p]) for p in PHASES) or 1e-12
            results.append(
                BenchResult(
                    name,
                    size,
                    summarize(secs, size),
                    "perf_counter",
                    phases_ms={p: 1000.0 * sum(rec[p]) / len(rec[p]) for p in PHASES},
                    phase_share={p: sum(rec[p]) / total for p in PHASES},
                )
            )
    return results


__all__ = [
    "DEFAULT_BATCH_SIZES",
    "BenchResult",
    "LatencyStats",
    "cpu_model",
    "environment",
    "parse_batch_sizes",
    "percentile",
    "run_bench",
    "speed_ratio",
    "summarize",
]
