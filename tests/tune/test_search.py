"""`vitdeploy tune`'s search, on a stand-in server whose figure per candidate the test decides (our own search
logic only: the real servers are measured in test_tuner.py): it finds the best, never measures a candidate
twice, changes batch settings in place, honours the budget, stops on Ctrl-C with the best so far, and the
overlay it writes says what was measured."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from vitdeploy.base.config import parse_config
from vitdeploy.client.loadgen import LevelResult
from vitdeploy.tune.measure import Figure
from vitdeploy.tune.overlay import overlay_text
from vitdeploy.tune.search import BUDGET, DONE, INTERRUPTED, TRIALS, search_serve
from vitdeploy.tune.space import ServeCandidate, default_candidate, grid, layouts

START = default_candidate(parse_config({}).serve, cores=2, backend="ort")


def rps_of(c: ServeCandidate) -> float:
    """The stand-in's throughput: best at 2 replicas x 1 CPU, 1 call, batch 4, no wait, on ort."""
    score = 100.0
    score += 40 if (c.replicas, c.cpus_per_replica) == (2, 1) else 0
    score += 20 if c.concurrent_batches == 1 else 0
    score += 30 - 5 * abs(c.max_batch_size - 4) if c.max_batch_size <= 8 else 0
    score += 10 if c.batch_wait_timeout_s == 0 else 0
    score -= 50 if c.backend != "ort" else 0
    return score


class StandIn:
    url, name = "http://127.0.0.1:9", "m"

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.applied: list[tuple[ServeCandidate, str]] = []
        self.interrupt_at = interrupt_at
        self.current: ServeCandidate | None = None

    def apply(self, cand: ServeCandidate) -> str:
        how = "started" if self.current is None else "in place"
        if self.current is not None and self.current.restart_key != cand.restart_key:
            how = "replicas replaced"
        self.current = cand
        self.applied.append((cand, how))
        if self.interrupt_at is not None and len(self.applied) == self.interrupt_at:
            raise KeyboardInterrupt
        return how

    def measure(self, target, images, start_clients, level_s, slo_p99_ms=None, warmup_s=0, stop=lambda: False):
        rps = rps_of(self.current)
        level = LevelResult("concurrency", start_clients, seconds=1.0, latencies_ms=[10.0] * 9 + [15.0])
        level.statuses["200"] = int(rps)
        return Figure([level], slo_p99_ms=slo_p99_ms)


def _search(stand_in: StandIn, budget_s: float = 600.0, **kw):
    return search_serve(
        stand_in,
        [b"img"],
        START,
        cores=2,
        max_batch=32,
        backends=("ort", "ort-int8"),
        budget_s=budget_s,
        measure_fn=stand_in.measure,
        **kw,
    )


def test_coordinate_descent_finds_the_best_of_the_grid_and_measures_each_candidate_once():
    stand_in = StandIn()
    result = _search(stand_in)
    best_of_grid = max(rps_of(replace(c, decode_threads=START.decode_threads)) for c in grid(2, 32, "ort"))
    assert result.stopped == DONE and result.best.figure.throughput == best_of_grid
    assert (result.best.candidate.replicas, result.best.candidate.max_batch_size) == (2, 4)
    applied = [c for c, _ in stand_in.applied]
    assert len(applied) == len(set(applied)) == len(result.trials) < len(grid(2, 32, "ort")) / 2
    assert result.default.candidate == START and result.gain == pytest.approx(result.best.figure.throughput / 100.0)
    # batch size and wait change the running replicas; only the backend, layout, calls or decode threads replace them
    for cand, how in stand_in.applied[1:]:
        if how == "in place":
            assert cand.restart_key == stand_in.applied[stand_in.applied.index((cand, how)) - 1][0].restart_key


def test_the_budget_ends_the_search_with_the_best_so_far():
    stand_in = StandIn()
    result = _search(stand_in, budget_s=1e-9)
    assert result.stopped == BUDGET and result.trials == [] and result.best is None  # not even the start fits
    result = _search(StandIn(), budget_s=600.0, passes=1)
    assert result.stopped == DONE


def test_trials_end_the_search_after_that_many_measured_settings_with_the_best_of_them():
    stand_in = StandIn()
    result = _search(stand_in, max_trials=3)
    assert result.stopped == TRIALS and len(result.trials) == len(stand_in.applied) == 3
    assert result.best.figure.throughput == max(t.figure.throughput for t in result.trials)


def test_ctrl_c_ends_the_search_with_the_best_measured_so_far():
    stand_in = StandIn(interrupt_at=4)
    result = _search(stand_in)
    assert result.stopped == INTERRUPTED and len(result.trials) == 3
    assert result.best.figure.throughput == max(t.figure.throughput for t in result.trials)


def test_the_overlay_is_a_pipeline_file_with_the_figure_beside_each_key(tmp_path):
    result = _search(StandIn())
    text = overlay_text(result, tmp_path)
    cfg = parse_config(yaml.safe_load(text), None)  # what `config check` runs
    best = result.best.candidate
    assert cfg.runtime.backend == best.backend and cfg.serve.replicas == best.replicas
    assert cfg.serve.max_batch_size == 4 and cfg.serve.batch_wait_timeout_s == 0
    line = next(x for x in text.splitlines() if x.startswith("  max_batch_size:"))
    assert f"# {result.best.figure.throughput:.1f} req/s (else 1: " in line
    assert "objective: the highest throughput whose p99 is within 2x its p50" in text
    assert f"{result.gain:.2f}x" in text


def test_layouts_fill_the_machine():
    assert layouts(2) == [(1, 2), (2, 1)]
    assert all(r * c == 16 for r, c in layouts(16)) and (4, 4) in layouts(16)


def test_a_goal_no_setting_meets_writes_the_closest_and_exits_3(tmp_path, monkeypatch):
    """--slo-p99-ms below what any candidate reached: the overlay holds the closest settings (the lowest p99),
    and the command says so and exits 3, so a script does not take them for a pass."""
    from click.testing import CliRunner

    from vitdeploy.cli import main
    from vitdeploy.tune import tuner

    result = _search(StandIn(), slo_p99_ms=1.0, passes=1)
    assert result.best.figure.best is None and result.best.figure.lowest_p99 == pytest.approx(
        14.55
    )  # numpy p99 of nine 10s and a 15
    monkeypatch.setattr(tuner, "run_tune", lambda *a, **k: result)
    out = tmp_path / "tuned.yaml"
    cli = CliRunner().invoke(main, ["tune", "-a", str(tmp_path), "--slo-p99-ms", "1", "-o", str(out)])
    assert cli.exit_code == 3, cli.output
    assert (
        "no setting met --slo-p99-ms 1" in cli.output and "none within the objective (lowest p99 15 ms)" in cli.output
    )
    assert "# no candidate met the objective" in out.read_text()
