"""`vitdeploy bench`: statistics, interleaving, the ratio column, JSON output, a real short run."""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.base.errors import BackendError
from vitdeploy.evaluate.bench import BenchResult, percentile, summarize
from vitdeploy.evaluate.bench_report import BASELINE, BenchReport, attach_ratios, format_bench_table
from vitdeploy.evaluate.reliability import SPREAD_LIMIT, Contention, busy_machine_reason, mark_unreliable
from vitdeploy.evaluate.timing import interleaved, measure

# ----------------------------------------------------------------------------- statistics


def test_percentiles_on_known_samples():
    samples = list(range(1, 101))  # 1..100, shuffled order must not matter
    rng = np.random.default_rng(0)
    rng.shuffle(samples)
    assert percentile(samples, 50) == pytest.approx(50.5)
    assert percentile(samples, 90) == pytest.approx(90.1)
    assert percentile(samples, 99) == pytest.approx(99.01)
    assert percentile(samples, 0) == 1 and percentile(samples, 100) == 100
    assert percentile([10, 20, 30, 40], 50) == pytest.approx(25.0)
    assert percentile([7.0], 99) == 7.0
    for q in (50, 90, 99):  # same definition as numpy's default
        assert percentile(samples, q) == pytest.approx(np.percentile(samples, q))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_in_milliseconds_and_throughput():
    stats = summarize([0.010, 0.020, 0.030, 0.040], batch_size=8)
    assert stats.p50_ms == pytest.approx(25.0)
    assert stats.mean_ms == pytest.approx(25.0) and stats.min_ms == pytest.approx(10.0)
    assert stats.images_per_s == pytest.approx(8 * 4 / 0.1)  # 320 images in total over 0.1 s
    assert stats.samples == 4


# ----------------------------------------------------------------------------- interleaving


def test_interleaved_order_rotates_the_first_backend():
    assert list(interleaved(["a", "b", "c"], 3)) == [
        (0, "a"),
        (0, "b"),
        (0, "c"),
        (1, "b"),
        (1, "c"),
        (1, "a"),
        (2, "c"),
        (2, "a"),
        (2, "b"),
    ]


def test_measure_runs_backends_round_robin_after_warmup_and_drops_a_failing_one():
    calls: list[str] = []

    def runner(name: str):
        def run():
            calls.append(name)
            if name == "bad" and len([c for c in calls if c == "bad"]) == 3:
                raise BackendError("boom")

        return run

    errors = {}
    times = measure(
        {n: runner(n) for n in ("x", "y", "bad")},
        iterations=3,
        warmup=1,
        timers={"x": lambda fn: (fn(), 0.5)[1]},
        on_error=lambda n, e: errors.setdefault(n, str(e)),
    )
    # warm-up: x y bad; then rotating: x y bad | y bad(fails, dropped) x | x y   (bad's turn skipped)
    assert calls == ["x", "y", "bad", "x", "y", "bad", "y", "bad", "x", "x", "y"]
    assert errors == {"bad": "boom"}
    assert times["x"] == [0.5, 0.5, 0.5]  # the timer given for x was used
    assert len(times["y"]) == 3 and len(times["bad"]) == 1


# ----------------------------------------------------------------------------- ratios and table


def _report(results: list[BenchResult]) -> BenchReport:
    return BenchReport(
        artifacts="a",
        model="m",
        mode="inference",
        settings={"batch_sizes": [1, 8], "iterations": 2, "warmup": 0},
        environment={"cpu": "Test CPU", "cpu_count": 2, "versions": {"torch": "x"}},
        backends=[
            {"name": "torch", "status": "ran", "reason": ""},
            {"name": "ort", "status": "ran", "reason": ""},
            {"name": "trt", "status": "unavailable", "reason": "no CUDA GPU: test"},
        ],
        results=results,
    )


def test_ratio_column_is_speed_relative_to_eager_torch_at_the_same_batch_size():
    results = [
        BenchResult("torch", 1, summarize([0.010] * 3, 1), "perf_counter"),
        BenchResult("ort", 1, summarize([0.004] * 3, 1), "perf_counter"),
        BenchResult("torch", 8, summarize([0.040] * 3, 8), "perf_counter"),
        BenchResult("ort", 8, summarize([0.080] * 3, 8), "perf_counter"),
    ]
    attach_ratios(results)
    assert [r.speedup for r in results] == pytest.approx([1.0, 2.5, 1.0, 0.5])
    lines = format_bench_table(_report(results))
    table = "\n".join(lines)
    ort1 = next(line for line in lines if line.startswith("ort ") and line.split()[1] == "1")
    assert "2.50x" in ort1
    assert "0.50x" in table and "1.00x" in table
    assert "trt" in table and "no CUDA GPU: test" in table  # unavailable backends listed with the reason
    assert "Test CPU" in table


# ----------------------------------------------------------------------------- unreliable ratios


def _steady(ms: float, n: int = 20, jitter: float = 0.03) -> list[float]:
    """n latencies around ``ms`` (seconds), spread by a few percent: a quiet machine."""
    rng = np.random.default_rng(int(ms * 1000))
    return list(ms / 1000 * (1 + jitter * rng.random(n)))


def _collapsing(fast_ms: float, slow_ms: float, n: int = 20, slow_share: float = 0.3) -> list[float]:
    """torch's OpenMP threads under contention: most calls fast, a share of them 100x slower."""
    slow = int(n * slow_share)
    return _steady(fast_ms, n - slow) + _steady(slow_ms, slow)


def _results(torch_secs: list[float], ort_secs: list[float]) -> list[BenchResult]:
    results = [
        BenchResult("torch", 1, summarize(torch_secs, 1), "perf_counter"),
        BenchResult("ort", 1, summarize(ort_secs, 1), "perf_counter"),
    ]
    attach_ratios(results)
    return results


def test_quiet_figures_on_an_idle_machine_print_plain_ratios_and_no_warning():
    results = _results(_steady(10.0), _steady(4.0))
    mark_unreliable(results, busy_machine_reason(_window(0.1, cores=2), threads=2), BASELINE)
    assert all(r.unreliable == [] for r in results)
    assert all(r.stats.spread < 1.1 for r in results)
    table = "\n".join(format_bench_table(_report(results)))
    ort1 = next(line for line in table.splitlines() if line.startswith("ort "))
    assert " 2.4" in ort1 and "x*" not in table and "unreliable:" not in table and "warning:" not in table
    assert "p90/p50" in table  # the spread column is always there


def test_a_collapsing_baseline_marks_every_ratio_built_on_it_and_says_why():
    results = _results(_collapsing(1.7, 287.0), _steady(0.85))  # the seen "ort 341x"
    mark_unreliable(results, busy_machine_reason(_window(0.05, cores=2), threads=2), BASELINE)
    torch, ort = results
    assert torch.stats.spread > SPREAD_LIMIT and ort.stats.spread < 1.1
    assert ort.unreliable == [f"torch p90/p50 {torch.stats.spread:.1f}"]
    lines = format_bench_table(_report(results))
    ort1 = next(line for line in lines if line.startswith("ort "))
    assert f"{ort.speedup:.2f}x*" in ort1 and f"*unreliable: torch p90/p50 {torch.stats.spread:.1f}" in ort1
    assert any(line.startswith("warning: ratios marked * are unreliable") for line in lines)
    assert ort.to_dict()["speedup_unreliable"] == ort.unreliable
    assert ort.to_dict()["p90_over_p50"] == pytest.approx(ort.stats.spread, abs=1e-3)


def _window(competing_cores: float, cores: int, steal_share: float = 0.0, wall_s: float = 10.0) -> Contention:
    """A timed window in which other work took ``competing_cores`` cores on average."""
    total = competing_cores * wall_s
    return Contention(wall_s, total * (1 - steal_share), total * steal_share, cores)


def test_a_busy_machine_marks_every_ratio_even_with_steady_figures():
    results = _results(_steady(10.0), _steady(4.0))
    busy = busy_machine_reason(_window(1.6, cores=2), threads=2)
    assert busy == "other work took 1.60 of 2 cores while 2 thread(s) needed 2"
    mark_unreliable(results, busy, BASELINE)
    assert [r.unreliable for r in results] == [[busy], [busy]]
    ort1 = next(line for line in format_bench_table(_report(results)) if line.startswith("ort "))
    assert "2.4" in ort1 and "x*" in ort1 and "other work took 1.60 of 2 cores" in ort1


@pytest.mark.parametrize(
    "competing, steal_share, cores, threads, busy",
    [
        (0.05, 0.0, 2, 2, False),  # idle: a few daemons
        (1.0, 0.0, 2, 2, True),  # one core taken: 2 threads need 2
        (1.0, 0.0, 2, 1, False),  # one core taken, one thread: fits
        (1.8, 0.0, 2, 1, True),
        (1.0, 1.0, 2, 2, True),  # the hypervisor stole a core's worth
        (0.4, 0.5, 2, 2, False),  # within the slack
        (6.0, 0.0, 16, None, True),  # threads default to one per core: 6 + 16 > 16.5
        (6.0, 0.0, 16, 8, False),  # 8 threads fit beside 6 busy cores
    ],
)
def test_contention_rule(competing, steal_share, cores, threads, busy):
    reason = busy_machine_reason(_window(competing, cores, steal_share), threads=threads)
    assert (reason is not None) == busy, reason
    if busy:
        assert reason.startswith("other work took ") and f"of {cores} cores" in reason


def test_unknown_contention_flags_nothing():
    assert busy_machine_reason(None, threads=2) is None  # no /proc here: the spread still speaks
