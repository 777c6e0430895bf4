"""Helpers shared by the benchmarks: environment report, ONNX Runtime sessions, interleaved timing."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable

import numpy as np

from vitdeploy.base.machine import cpu_model


def cpu_flags(wanted: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")) -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "missing"


def contention_since(before) -> str:
    """What other processes (and the hypervisor's steal) took of the CPU since ``before``
    (``vitdeploy.evaluate.reliability.sample()``): the figure that says whether a ratio was disturbed."""
    from vitdeploy.evaluate.reliability import contention, sample, usable_cores

    window = contention(before, sample(), usable_cores())
    return window.describe() if window else "contention unknown (no /proc/stat)"


def environment(threads: int) -> dict[str, object]:
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {d: version(d) for d in ("torch", "onnxruntime", "onnx", "onnxscript", "numpy", "vitdeploy")},
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
    }


def ort_session(
    path: str,
    *,
    threads: int,
    spinning: bool = True,
    level: str = "all",
    inter_op: int | None = None,
    spin_stop: bool = False,
):
    """An ONNX Runtime CPU session. ``spinning=True, level="all", inter_op=None`` is ORT's default
    apart from the intra-op thread count (what vitdeploy's OrtBackend and a plain user do)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    so.intra_op_num_threads = threads
    if inter_op is not None:
        so.inter_op_num_threads = inter_op
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if spin_stop:  # spin while a Run() lasts, stop as soon as it returns
        so.add_session_config_entry("session.force_spinning_stop", "1")
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


@dataclass
class Timings:
    samples_ms: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.samples_ms[name])

    def p90(self, name: str) -> float:
        return float(np.percentile(self.samples_ms[name], 90))

    def mean(self, name: str) -> float:
        return statistics.fmean(self.samples_ms[name])


def interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    warmup: int,
    iters: int,
    seed: int = 0,
    gap_s: float = 0.0,
    progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timings:
    """Round-robin timing: each round calls every function once, in a fresh random order, so
    background load and thermal drift hit all variants alike. ``warmup`` rounds are discarded.
    ``clock``: ``time.thread_time`` times the calling thread's CPU time instead of the wall (with one
    intra-op thread, what a call computes, whatever other processes took meanwhile)."""
    rng = random.Random(seed)
    names = list(fns)
    out = Timings({n: [] for n in names})
    for r in range(warmup + iters):
        rng.shuffle(names)
        for n in names:
            if gap_s:
                time.sleep(gap_s)  # let the previous variant's spinning threads go idle
            t0 = clock()
            fns[n]()
            dt = (clock() - t0) * 1000.0
            if r >= warmup:
                out.samples_ms[n].append(dt)
        if progress:
            progress(r + 1)
    return out


def drift(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "top1_agreement": float(np.mean(ref.argmax(-1) == got.argmax(-1))),
    }


def _burn(stop) -> None:  # pragma: no cover - runs in a child process
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


@contextlib.contextmanager
def background_load(processes: int):
    """``processes`` busy-looping child processes for the duration of the block: a reproducible
    stand-in for the other work a shared CPU does (preprocessing workers, a web server, ...)."""
    if processes <= 0:
        yield
        return
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
