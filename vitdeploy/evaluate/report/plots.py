"""The report's pictures, drawn by matplotlib (Agg, offline) into inline SVG strings.

Colours are the Okabe-Ito palette (readable by colour-blind readers) with a distinct marker and line
style per series, so a grey print still tells them apart; every axis has its unit.
"""

from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

from ...base._deps import require

#: Okabe & Ito's colour-blind-safe palette, then markers and dashes that survive a grey print
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":", "-", "--", "-.", ":")


def _pyplot() -> Any:
    matplotlib = require("matplotlib", "vitdeploy report (pip install 'vitdeploy[report]')")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # inline: no XML prolog or doctype inside the HTML


#: where a drift value of 0 is drawn on a log axis (per-image values are kept to 7 decimals, so 0 means
#: below 5e-8; 1e-8 sits a decade under the smallest value the record can hold)
LOG_FLOOR = 1e-8
#: metric -> (what the axis shows, its unit, the value drawn from the recorded one): both on a log axis, as
#: the backends' drifts span decades (1e-7 for FP32 graphs to 1e-1 for INT8) and a log axis keeps each apart
DRIFT_AXES = {
    "max_abs_diff": ("max |diff| (log)", "the output's units: logits, or an embedding's values", lambda v: v),
    "cosine": ("1 \N{MINUS SIGN} cosine (log)", "0: the same direction", lambda v: 1.0 - v),
}


def drift_figure(per_backend: Mapping[str, Mapping[str, Sequence[float | None]]], metric: str) -> Any:
    """The matplotlib figure of :func:`drift_distribution` (tests read its axes)."""
    title, unit, drawn_value = DRIFT_AXES[metric]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.0))
    drawn = clipped = 0
    for i, (name, values) in enumerate(per_backend.items()):
        raw = sorted(max(drawn_value(v), 0.0) for v in values.get(metric, []) if v is not None)
        if not raw:
            continue
        clipped += sum(v < LOG_FLOOR for v in raw)
        xs = [max(v, LOG_FLOOR) for v in raw]
        ys = [(k + 1) / len(xs) for k in range(len(xs))]
        ax.step(xs, ys, where="post", color=COLOURS[i % 8], linestyle=DASHES[i % 8], label=name)
        ax.plot(xs[-1:], ys[-1:], marker=MARKERS[i % 8], color=COLOURS[i % 8], linestyle="none")
        drawn += 1
    ax.set_xscale("log")
    at = f"{LOG_FLOOR:.0e}".replace("e-0", "e-")
    floor = f"\n{clipped} value(s) at 0 (or under {at}) drawn at {at}, the axis's floor" if clipped else ""
    ax.set_xlabel(f"{title} against eager PyTorch ({unit}){floor}")
    ax.set_ylabel("share of images (at or below)")
    ax.set_ylim(0, 1.02)
    if drawn:
        if clipped:  # the floor's points inside the frame, off its edge
            ax.set_xlim(LOG_FLOOR / 2, ax.get_xlim()[1])
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.set_xlim(LOG_FLOOR, 1.0)
    return fig


def drift_distribution(per_backend: Mapping[str, Mapping[str, Sequence[float | None]]], metric: str) -> str:
    """One curve per backend: the share of images at or below each value of ``metric`` (an empirical CDF:
    every image counts, and several backends stay readable on one axis), as inline SVG. ``metric`` is a key
    of :data:`DRIFT_AXES`: max |logit diff| and 1 - cosine, both on a log axis (0 drawn at :data:`LOG_FLOOR`)."""
    return _svg(drift_figure(per_backend, metric))


def latency_by_batch(results: Sequence[Mapping[str, Any]]) -> str:
    """p50 latency (with p90 as a dashed twin) against batch size, one series per backend."""
    plt = _pyplot()
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(7.5, 3.0))
    names = list(dict.fromkeys(r["backend"] for r in results))
    for i, name in enumerate(names):
        rows = sorted((r for r in results if r["backend"] == name), key=lambda r: r["batch_size"])
        b = [r["batch_size"] for r in rows]
        style = dict(color=COLOURS[i % 8], marker=MARKERS[i % 8])
        lat.plot(b, [r["p50_ms"] for r in rows], linestyle=DASHES[i % 8], label=f"{name} p50", **style)
        lat.plot(b, [r["p90_ms"] for r in rows], linestyle=":", alpha=0.6, **style)
        thr.plot(b, [r["images_per_s"] for r in rows], linestyle=DASHES[i % 8], label=name, **style)
    for ax in (lat, thr):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (images per call)")
    lat.set_ylabel("latency per call (ms; dotted: p90)")
    thr.set_ylabel("throughput (images/s)")
    if names:
        lat.legend(fontsize=7)
        thr.legend(fontsize=7)
    fig.tight_layout()
    return _svg(fig)


#: fills of stacked segments that a grey print still tells apart; the last segment is drawn in light grey
HATCHES = ("", "//", "..", "xx", "\\\\", "--", "oo", "++")
REST_COLOUR = "#D9D9D9"
MARKS = ("o", "v", "s", "^")


def stacked_figure(
    labels: Sequence[str],
    stacks: Sequence[tuple[str, Sequence[float]]],
    marks: Sequence[tuple[str, Sequence[float | None]]],
    ylabel: str,
    xlabel: str,
) -> Any:
    """The matplotlib figure of :func:`stacked_bars` (tests read its bars)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 + 1.1 * len(labels)), 3.2))
    xs = list(range(len(labels)))
    bottom = [0.0] * len(labels)
    bars = []
    for i, (name, heights) in enumerate(stacks):
        colour = REST_COLOUR if i == len(stacks) - 1 else COLOURS[i % 8]
        style = dict(color=colour, hatch=HATCHES[i % 8], edgecolor="#333333", linewidth=0.5)
        bars.append(ax.bar(xs, heights, 0.6, bottom=bottom, label=name, **style))
        bottom = [b + h for b, h in zip(bottom, heights)]
    points = []
    for i, (name, values) in enumerate(marks):
        ys = [float("nan") if v is None else v for v in values]
        style = dict(linestyle="none", marker=MARKS[i % 4], color="#000000", markersize=6)
        points += ax.plot(xs, ys, label=name, **style)
    ax.set_xticks(xs, labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_axisbelow(True)  # the grid behind the bars
    shown = [*reversed(points), *reversed(bars)]  # top to bottom, as they are drawn
    ax.legend(shown, [h.get_label() for h in shown], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


def stacked_bars(
    labels: Sequence[str],
    stacks: Sequence[tuple[str, Sequence[float]]],
    marks: Sequence[tuple[str, Sequence[float | None]]],
    ylabel: str,
    xlabel: str,
) -> str:
    """One bar per label stacked from ``stacks`` (name, a height per label; the last drawn in grey: what the
    others leave), with ``marks`` (name, a value per label, None for none) as black markers on them, as inline
    SVG."""
    return _svg(stacked_figure(labels, stacks, marks, ylabel, xlabel))


__all__ = [
    "COLOURS",
    "DRIFT_AXES",
    "LOG_FLOOR",
    "drift_distribution",
    "drift_figure",
    "latency_by_batch",
    "stacked_bars",
    "stacked_figure",
]
