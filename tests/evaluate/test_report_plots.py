"""The report's drift plots read as a person reads them: 1 - cosine and max |logit diff| on log axes whose
titles say so, no tick below 0 on a non-negative axis, no offset label (``1e-7+1``), and a value of 0 drawn
at a floor the axis states."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")

from vitdeploy.evaluate.report.plots import LOG_FLOOR, drift_distribution, drift_figure  # noqa: E402

#: what the demo's page showed: FP32 graphs within 1e-7..1e-6, FP16 near 1e-3, INT8 near 1e-1; cosines that
#: round to 1.0 at 7 decimals (1 - cosine = 0) beside ones a few 1e-7 under it
PER_BACKEND = {
    "ort": {"max_abs_diff": [0.0, 2e-7, 1.2e-6], "cosine": [1.0, 1.0, 1.0]},
    "ort-fp16": {"max_abs_diff": [3e-4, 1.6e-3, None], "cosine": [1.0, 0.9999999, 0.9999998]},
    "ort-int8": {"max_abs_diff": [2e-2, 1e-1, 1.5e-1], "cosine": [0.9999, 0.9995, 0.998]},
}


@pytest.fixture
def axes():
    import matplotlib.pyplot as plt

    figs = {}

    def draw(metric, per=PER_BACKEND):
        fig = drift_figure(per, metric)
        fig.canvas.draw()  # ticks and the offset label as a reader sees them
        figs[metric] = fig
        return fig.axes[0]

    yield draw
    for fig in figs.values():
        plt.close(fig)


def _visible_ticks(ax) -> list[float]:
    low, high = ax.get_xlim()
    return [t for t in ax.get_xticks() if low <= t <= high]


def test_cosine_is_drawn_as_one_minus_cosine_on_a_log_axis_that_says_so(axes):
    ax = axes("cosine")
    assert ax.get_xscale() == "log"
    assert ax.get_xlabel().startswith("1 \N{MINUS SIGN} cosine (log)")
    assert ax.xaxis.get_offset_text().get_text() == ""  # never the offset axis "1e-7+1"
    assert min(_visible_ticks(ax)) > 0 and ax.get_xlim()[0] > 0
    drawn = {
        line.get_label(): list(line.get_xdata()) for line in ax.get_lines() if not line.get_label().startswith("_")
    }
    assert drawn["ort"] == [LOG_FLOOR] * 3  # 1 - 1.0 = 0: at the floor
    assert drawn["ort-int8"] == pytest.approx([1e-4, 5e-4, 2e-3], rel=1e-6)  # 1 - cosine, worst last
    assert ax.get_xlim()[0] < LOG_FLOOR  # the floor's points inside the frame


def test_a_zero_drawn_at_the_floor_is_said_on_the_axis(axes):
    label = axes("cosine").get_xlabel()
    assert "4 value(s) at 0 (or under 1e-8) drawn at 1e-8" in label  # ort's three, fp16's one


def test_max_abs_diff_has_no_tick_or_range_below_zero(axes):
    ax = axes("max_abs_diff")
    assert ax.get_xscale() == "log"  # 1e-7..1e-1: six decades, each backend apart
    assert ax.get_xlabel().startswith("max |diff| (log)")
    assert ax.get_xlim()[0] > 0 and all(t > 0 for t in _visible_ticks(ax))
    assert ax.xaxis.get_offset_text().get_text() == ""
    assert "1 value(s) at 0" in ax.get_xlabel()  # ort's exact 0


def test_no_floor_note_when_no_value_is_clipped(axes):
    ax = axes("max_abs_diff", {"ort-int8": PER_BACKEND["ort-int8"]})
    assert "drawn at" not in ax.get_xlabel() and ax.get_xscale() == "log"


def test_the_svg_is_inline_text_with_the_axis_title():
    svg = drift_distribution(PER_BACKEND, "cosine")
    assert svg.startswith("<svg") and "1 \N{MINUS SIGN} cosine (log)" in svg
    assert "1e-7+1" not in svg and "<image" not in svg  # drawn by matplotlib as vectors, no raster, no offset


def test_a_backend_without_values_draws_an_empty_log_axis(axes):
    ax = axes("cosine", {"ort": {"cosine": [None]}})
    assert ax.get_xscale() == "log" and ax.get_xlim()[0] > 0 and ax.get_legend() is None
