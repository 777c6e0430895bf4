"""The INT8 autopilot's search (export/int8_autopilot.py): the speed budget first, the largest step in it
looked at right after the fully quantized graph (on the inputs that failed there), a refusal at once when
even that misses the gate, and otherwise the fewest nodes in float that pass.

The graphs and the clock are test doubles: what is tested is which steps are built, judged and shipped,
the same on every machine (the real graphs: test_dequantize.py; the real pipeline: test_int8_speed.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from vitdeploy.export.autopilot import GateError
from vitdeploy.export.int8_autopilot import search_budget

#: the ladder after the fully quantized graph: each step one more node in float
STEPS = [(f"step {i}", tuple(f"n{j}" for j in range(i))) for i in range(1, 6)]


@dataclass
class _Graph:
    keep: tuple[str, ...]
    path: Path


class _Graphs:
    """Records which graphs were made, and which one shipped."""

    def __init__(self) -> None:
        self.made: list[tuple[str, ...]] = []
        self.shipped: _Graph | None = None

    def quantized(self) -> _Graph:
        self.made.append(())
        return _Graph((), Path("full"))

    def step(self, keep, slot) -> _Graph:
        self.made.append(tuple(keep))
        return _Graph(tuple(keep), Path(f"{slot}-{len(keep)}"))

    def ship(self, graph: _Graph) -> _Graph:
        self.shipped = graph
        return graph


@dataclass
class _Verdict:
    passed: bool
    metrics: dict
    failures: tuple


class _Speed:
    """Steps with at most ``most`` nodes in float can pay."""

    def __init__(self, most: int) -> None:
        self.most, self.timed, self.stopped = most, [], ""

    def check_full(self, path) -> None:
        self.timed.append(path)

    def can_pay(self, name, keep) -> bool:
        if len(keep) <= self.most:
            return True
        self.stopped = f"{name} would be too slow"
        return False


def _run(passing_from: int | None, speed: _Speed | None, quick: str | None = "proves"):
    """The search with steps that pass from ``passing_from`` nodes in float up (None: none passes). ``quick``:
    the first look at the largest step proves a failure ("proves"), never proves anything ("silent"), or is
    not there (None: the largest is judged on every input first)."""
    graphs, judged, looked = _Graphs(), [], []

    def keep_of(path: Path) -> int:
        return 0 if path.name == "full" else int(path.name.rsplit("-", 1)[1])

    def verdict(keep: int) -> _Verdict:
        ok = passing_from is not None and keep >= passing_from
        return _Verdict(ok, {"cosine": 1.0 if ok else 0.9}, () if ok else ("cosine: too low",))

    def judge(path: Path) -> _Verdict:
        judged.append(keep_of(path))
        return verdict(judged[-1])

    def first_look(path: Path) -> _Verdict | None:
        looked.append(keep_of(path))
        return verdict(looked[-1]) if quick == "proves" and not verdict(looked[-1]).passed else None

    res = search_budget(
        "all quantized",
        lambda: list(STEPS),
        graphs,
        judge,
        unmet="validate-int8: not met",
        speed=speed,
        quick=first_look if quick else None,
    )
    return res, graphs, judged, looked


def test_a_graph_that_passes_fully_quantized_costs_one_judgement():
    res, graphs, judged, looked = _run(0, _Speed(3))
    assert judged == [0] and not looked and graphs.made == [()] and graphs.shipped.keep == ()
    assert [s.name for s in res.steps] == ["all quantized"]


def test_when_the_largest_step_the_speed_allows_fails_no_other_step_is_built():
    speed = _Speed(3)
    with pytest.raises(GateError, match="cannot both be met: step 3 missed validation.int8") as err:
        _run(4, speed)  # only a step past the budget would pass
    assert "step 4 would be too slow" in str(err.value) and speed.timed == [Path("full")]
    # judged once on every input; the largest step in the budget only on the inputs that failed there
    assert [s.name for s in err.value.steps] == ["all quantized", "step 3"]


def test_inside_the_budget_the_fewest_nodes_in_float_that_pass_ship():
    res, graphs, judged, looked = _run(2, _Speed(4))
    assert looked == [4] and judged == [0, 1, 2]  # a first look at the largest, then from the fewest up
    assert graphs.shipped.keep == STEPS[1][1] and res.result is graphs.shipped
    assert [s.name for s in res.steps] == ["all quantized", "step 1", "step 2"]


def test_the_largest_step_ships_when_none_before_it_passes():
    res, graphs, judged, looked = _run(4, _Speed(4))
    assert judged == [0, 1, 2, 3, 4] and graphs.shipped.keep == STEPS[3][1]
    assert graphs.made.count(STEPS[3][1]) == 1  # made once, judged last, shipped as judged


def test_a_largest_step_the_first_look_cannot_refuse_is_judged_last():
    with pytest.raises(GateError, match="cannot both be met: step 4 missed") as err:
        _run(5, _Speed(4), quick="silent")
    assert [s.name for s in err.value.steps] == ["all quantized", "step 1", "step 2", "step 3", "step 4"]


def test_without_a_first_look_the_largest_step_is_judged_on_every_input_first():
    res, graphs, judged, looked = _run(2, _Speed(4), quick=None)
    assert judged == [0, 4, 1, 2] and graphs.shipped.keep == STEPS[1][1]
    with pytest.raises(GateError, match="cannot both be met: step 3 missed"):
        _run(4, _Speed(3), quick=None)


def test_without_a_speed_guard_the_budget_is_the_whole_ladder():
    with pytest.raises(GateError, match="not met .*2 steps judged") as err:
        _run(None, None)
    assert [s.keep_float for s in err.value.steps] == [(), STEPS[-1][1]]


def test_when_no_step_after_the_first_can_pay_the_fully_quantized_graph_is_the_only_one():
    with pytest.raises(GateError, match="all quantized missed validation.int8 .* step 1 would be too slow"):
        _run(1, _Speed(0))
