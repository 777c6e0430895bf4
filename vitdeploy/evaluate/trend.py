"""Is a series growing? A least-squares trend with a confidence interval that allows for its samples'
autocorrelation, and the verdicts a soak draws from it (benchmarks/soak_serve.py: a replica's memory, the p99
per window).

A long run's samples are not independent: memory moves in steps (an arena, a cache filling) and stays there, so
neighbouring samples share their error and a plain least-squares interval is far too narrow. The interval here
counts the samples the series is worth (Santer et al., 2000: ``n_eff = n (1 - r1) / (1 + r1)``, ``r1`` the
lag-1 autocorrelation of the residuals) and widens with a Student t of ``n_eff - 2`` degrees of freedom. The
slopes of the two halves say what kind of growth it is: the end of a warm-up slows down (the second half flat,
the first rising), a leak does not (both halves alike).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

HOUR_S = 3600.0
_Z975 = 1.959964  # the standard normal's 97.5% quantile


@dataclass(frozen=True)
class Trend:
    """A least-squares line through (seconds, value) samples; slopes per hour, in the values' unit."""

    slope: float  # per hour
    low: float  # the slope's 95% interval, per hour (-inf/inf when the samples are worth too few)
    high: float
    residual_sd: float  # the samples' spread around the line
    points: int
    effective: float  # the independent samples the series is worth (lag-1 autocorrelation)
    first_half: float  # slope per hour of the first and of the second half of the samples
    second_half: float

    def to_dict(self) -> dict[str, float]:
        return {k: (round(v, 4) if math.isfinite(v) else None) for k, v in asdict(self).items()}


def t_quantile_975(df: float) -> float:
    """Student's t 97.5% quantile for ``df`` degrees of freedom (Cornish-Fisher expansion about the normal;
    within 1% from df 3, exact enough for an interval); inf below 1."""
    if df < 1:
        return math.inf
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def _slope(t: np.ndarray, y: np.ndarray) -> float:
    if len(t) < 2 or np.ptp(t) == 0:
        return math.nan
    return float(np.polyfit(t, y, 1)[0]) * HOUR_S


def fit_trend(times_s: Sequence[float], values: Sequence[float]) -> Trend:
    """The trend of ``values`` sampled at ``times_s`` (seconds): slope per hour, its 95% interval adjusted for
    the residuals' autocorrelation, the residual spread and the two halves' slopes. Needs 3 samples."""
    t, y = np.asarray(times_s, dtype=float), np.asarray(values, dtype=float)
    n = len(t)
    if n < 3 or np.ptp(t) == 0:
        raise ValueError(f"a trend needs at least 3 samples at different times, got {n}")
    slope_s, intercept = np.polyfit(t, y, 1)
    resid = y - (slope_s * t + intercept)
    ss = float(resid @ resid)
    r1 = float(resid[:-1] @ resid[1:]) / ss if ss > 0 else 0.0
    r1 = min(max(r1, 0.0), 0.99)  # a negative r1 would claim more samples than were taken
    effective = n * (1 - r1) / (1 + r1)
    spread_t = float(((t - t.mean()) ** 2).sum())
    if effective > 2:
        se = math.sqrt(ss / (effective - 2) / spread_t) * HOUR_S
        half_width = t_quantile_975(effective - 2) * se
    else:
        half_width = math.inf if ss > 0 else 0.0
    slope = float(slope_s) * HOUR_S
    mid = n // 2
    return Trend(
        slope=slope,
        low=slope - half_width,
        high=slope + half_width,
        residual_sd=math.sqrt(ss / (n - 2)),
        points=n,
        effective=effective,
        first_half=_slope(t[: mid + 1], y[: mid + 1]),
        second_half=_slope(t[mid:], y[mid:]),
    )


def thirds(values: Sequence[float]) -> tuple[float, float]:
    """The medians of the first and of the last third of ``values`` (in order)."""
    y = [v for v in values if not math.isnan(v)]
    k = max(1, len(y) // 3)
    if not y:
        return math.nan, math.nan
    return float(np.median(y[:k])), float(np.median(y[-k:]))


@dataclass(frozen=True)
class Verdict:
    met: bool | None  # None: undecided (the interval straddles the limit)
    text: str


def judge_growth(trend: Trend, limit_per_h: float, unit: str = "MiB") -> Verdict:
    """A growth goal (``slope <= limit_per_h``): met when the whole interval is under it, not met when the slope
    itself is over, else undecided (a longer run narrows the interval)."""
    got = f"{trend.slope:+.1f} {unit}/h (95% interval {trend.low:+.1f} to {trend.high:+.1f})"
    if trend.high <= limit_per_h:
        return Verdict(True, f"{got} <= {limit_per_h:g} {unit}/h: met")
    if trend.slope > limit_per_h:
        return Verdict(False, f"{got} > {limit_per_h:g} {unit}/h: NOT MET")
    return Verdict(None, f"{got}: the interval reaches past {limit_per_h:g} {unit}/h: UNDECIDED (run longer)")


def judge_drift(times_s: Sequence[float], p99s: Sequence[float], tolerance: float = 0.10) -> tuple[Trend, Verdict]:
    """Whether a per-window p99 drifts upward: its slope's interval above 0 *and* the last third's median more
    than ``tolerance`` above the first third's (a slope alone may be real but negligible, a difference of
    thirds alone may be noise)."""
    trend = fit_trend(times_s, p99s)
    first, last = thirds(p99s)
    rise = last / first - 1 if first > 0 else math.nan
    got = (
        f"{trend.slope:+.2f} ms/h (95% interval {trend.low:+.2f} to {trend.high:+.2f}); median p99 of the first third "
        f"{first:.1f} ms, of the last {last:.1f} ms ({rise * 100:+.1f}%)"
    )
    if trend.low > 0 and rise > tolerance:
        return trend, Verdict(False, f"{got}: drifts upward: NOT MET")
    return trend, Verdict(True, f"{got}: no upward drift (tolerance {tolerance * 100:g}%): met")


__all__ = ["Trend", "Verdict", "fit_trend", "judge_drift", "judge_growth", "t_quantile_975", "thirds"]
