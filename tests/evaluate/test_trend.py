"""The soak's verdicts on synthetic series: a leak is told from the end of a warm-up and from flat noise, and a
p99 that climbs is told from one that only wobbles (benchmarks/soak_serve.py judges a replica with these)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vitdeploy.evaluate.trend import fit_trend, judge_drift, judge_growth, t_quantile_975, thirds

MIB = 1.0  # the series below are in MiB
MINUTES = np.arange(10, 60.01, 0.5)  # a 60-minute soak after its 10-minute warm-up, a sample every 30 s
T = MINUTES * 60.0


def _noise(seed: int, sd: float) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, sd, len(T))


def test_a_flat_series_meets_the_growth_goal_with_its_slope_near_zero():
    rss = 300 * MIB + _noise(0, 0.5)
    trend = fit_trend(T, rss)
    assert trend.low < 0 < trend.high and abs(trend.slope) < 2
    assert judge_growth(trend, 10).met is True


def test_a_slow_leak_is_not_met_and_both_halves_grow_alike():
    rss = 300 + 17 * T / 3600 + _noise(1, 0.5)  # the +17 MiB/h the 12-minute soak could not place
    trend = fit_trend(T, rss)
    assert trend.low < 17 < trend.high
    assert trend.first_half == pytest.approx(17, abs=4) and trend.second_half == pytest.approx(17, abs=4)
    verdict = judge_growth(trend, 10)
    assert verdict.met is False and "NOT MET" in verdict.text


def test_the_end_of_a_warm_up_slows_down_where_a_leak_does_not():
    rss = 300 + 40 * (1 - np.exp(-(MINUTES - 10) / 6)) + _noise(2, 0.2)  # arenas filling, then a plateau
    trend = fit_trend(T, rss)
    assert trend.first_half > 5 * max(trend.second_half, 0.1)
    assert abs(trend.second_half) < 3


def test_steps_that_stay_widen_the_interval_beyond_what_independent_samples_give():
    rng = np.random.default_rng(3)
    rss = 300 + np.cumsum(rng.choice([0.0, 0.0, 0.0, 1.0, -1.0], len(T)))  # a walk: neighbours share their error
    trend = fit_trend(T, rss)
    assert trend.effective < trend.points / 3
    naive_half_width = 1.96 * trend.residual_sd / math.sqrt(((T - T.mean()) ** 2).sum()) * 3600
    assert trend.high - trend.slope > 2 * naive_half_width


def test_an_interval_straddling_the_limit_is_undecided():
    rss = 300 + 8 * T / 3600 + _noise(4, 6.0)
    verdict = judge_growth(fit_trend(T, rss), 10)
    assert verdict.met is None and "UNDECIDED" in verdict.text


def test_a_p99_that_climbs_drifts_and_one_that_wobbles_does_not():
    climbing = 40 + 20 * T / 3600 + _noise(5, 1.0)  # +50% over the hour
    wobbling = 40 + 3 * np.sin(T / 300) + _noise(6, 1.0)
    assert judge_drift(T, climbing)[1].met is False
    assert judge_drift(T, wobbling)[1].met is True
    slight = 40 + 1.0 * T / 3600 + _noise(7, 0.1)  # real, but +2% of the p99: not a drift
    assert judge_drift(T, slight)[1].met is True


def test_thirds_and_the_t_quantile():
    assert thirds([1, 2, 3, 4, 5, 6, 70, 80, 90]) == (2.0, 80.0)
    assert t_quantile_975(3) == pytest.approx(3.182, rel=0.01)
    assert t_quantile_975(30) == pytest.approx(2.042, rel=0.001)
    with pytest.raises(ValueError, match="at least 3 samples"):
        fit_trend([0, 30], [1, 2])
