"""What `vitdeploy bench` reports: every figure with its ratio to eager PyTorch, and the report as people read
it (the settings, the machine, the table, the backends that did not run and why).

The run that fills it is ``bench.py``; one figure (``BenchResult``) and its statistics are ``timing.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .reliability import SPREAD_LIMIT
from .timing import BenchResult, speed_ratio

BASELINE = "torch"  # eager FP32 PyTorch on the CPU
#: the parts of an end-to-end figure, each timed on its own
PHASES = ("preprocess", "inference", "postprocess")


def format_environment(env: Mapping[str, Any]) -> list[str]:
    threads = env.get("threads_requested")
    affinity = f", {env['cpu_affinity']} usable" if "cpu_affinity" in env else ""
    lines = [
        f"cpu: {env.get('cpu')} ({env.get('cpu_count')} logical cores{affinity})",
        f"threads: {threads if threads else 'library defaults'}"
        + (f" (torch intra-op threads {env['torch_threads']})" if "torch_threads" in env else ""),
        _format_load(env),
        f"gpu: {', '.join(env.get('gpus') or []) or 'none'}",
        f"onnxruntime providers: {', '.join(env.get('onnxruntime_providers') or []) or 'none'}",
        "versions: " + ", ".join(f"{k} {v or 'missing'}" for k, v in (env.get("versions") or {}).items()),
        f"platform: {env.get('platform')}, Python {env.get('python')}",
    ]
    return lines


def _format_load(env: Mapping[str, Any]) -> str:
    window = env.get("contention")
    if not window:
        return "contention: unknown (no /proc/stat here)"
    return (
        f"contention while timed: other processes took {window['others_cpu_s']:.2f} CPU-s, steal "
        f"{window['steal_cpu_s']:.2f} CPU-s in {window['wall_s']:.1f} s ({window['competing_cores']:.2f} of "
        f"{window['cores']} cores)"
    )


@dataclass
class BenchReport:
    artifacts: str
    model: str
    mode: str  # "inference" | "end-to-end"
    settings: dict[str, Any]
    environment: dict[str, Any]
    backends: list[dict[str, Any]]  # {"name", "status": ran|unavailable|error, "reason", "describe", "baseline"}
    results: list[BenchResult] = field(default_factory=list)
    created: str = ""

    def result(self, backend: str, batch_size: int) -> BenchResult:
        for r in self.results:
            if r.backend == backend and r.batch_size == batch_size:
                return r
        raise KeyError((backend, batch_size))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "vitdeploy-bench-report",
            "version": 1,
            "created": self.created,
            "artifacts": self.artifacts,
            "model": self.model,
            "mode": self.mode,
            "settings": self.settings,
            "baseline": BASELINE + " (eager PyTorch fp32 on cpu)",
            "environment": self.environment,
            "backends": self.backends,
            "results": [r.to_dict() for r in self.results],
        }


def attach_ratios(results: list[BenchResult], baseline: str = BASELINE) -> None:
    """Set each result's ``speedup``: the baseline's p50 at the same batch size over its p50."""
    base = {r.batch_size: r.stats.p50_ms for r in results if r.backend == baseline}
    for r in results:
        r.speedup = speed_ratio(base.get(r.batch_size), r.stats.p50_ms)


def _ratio(value: float | None, unreliable: Sequence[str] = ()) -> str:
    return "-" if value is None else f"{value:.2f}x" + ("*" if unreliable else "")


def format_bench_table(report: BenchReport) -> list[str]:
    """Settings, environment, the results table (speed as a ratio to eager PyTorch) and the
    backends that did not run, with why."""
    s = report.settings
    lines = [
        f"{report.model}: {report.mode} benchmark, batch sizes {', '.join(map(str, s['batch_sizes']))}, "
        f"{s['iterations']} iterations after {s['warmup']} warm-up, backends interleaved",
        *format_environment(report.environment),
        "",
    ]
    e2e = report.mode == "end-to-end"
    head = (
        f"{'backend':<11} {'batch':>5} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'p90/p50':>7} {'img/s':>9} "
        f"{'vs torch':>9}"
    )
    head += f" {'pre':>5} {'infer':>5} {'post':>5}" if e2e else "  timer       "
    lines += [head, "-" * len(head)]
    for r in sorted(report.results, key=lambda r: (r.batch_size, _order(report, r.backend))):
        st = r.stats
        row = (
            f"{r.backend:<11} {r.batch_size:>5} {st.p50_ms:>9.3f} {st.p90_ms:>9.3f} {st.p99_ms:>9.3f} "
            f"{st.spread:>7.2f} {st.images_per_s:>9.1f} {_ratio(r.speedup, r.unreliable):>9}"
        )
        if e2e and r.phase_share:
            row += "".join(f" {100 * r.phase_share[p]:>4.0f}%" for p in PHASES)
        elif not e2e:
            row += f"  {r.timer:<12}"
        if r.unreliable and r.speedup is not None:
            row += f"  *unreliable: {', '.join(r.unreliable)}"
        lines.append(row.rstrip())
    notes = [b for b in report.backends if b["status"] != "ran"]
    if notes:
        lines.append("")
        for b in notes:
            lines.append(f"  {b['name']:<11} {b['status']}: {b['reason']}")
    lines.append("")
    lines.append(
        "vs torch: eager PyTorch fp32 on the CPU p50 / this p50 at the same batch size (higher is faster)"
        + ("; pre/infer/post: share of the end-to-end time" if e2e else "")
    )
    lines.append(
        f"p90/p50: the spread of each figure; above {SPREAD_LIMIT} (or when other processes took CPU the "
        "threads needed while timed, see contention above) a ratio is marked * unreliable"
    )
    if any(r.unreliable and r.speedup is not None for r in report.results):
        lines.append(
            "warning: ratios marked * are unreliable: their figures were disturbed while measured (most "
            "often by other work competing for the cores: torch's OpenMP threads collapse under "
            "contention); rerun on a quiet machine, or with fewer --threads"
        )
    return lines


def _order(report: BenchReport, name: str) -> int:
    names = [b["name"] for b in report.backends]
    return names.index(name) if name in names else len(names)


__all__ = ["BASELINE", "PHASES", "BenchReport", "attach_ratios", "format_bench_table", "format_environment"]
