"""The serving section's "Where a request's time goes": per load level, the server's own split of its answered
requests (its ``Server-Timing`` headers: mean ms of read, decode, batch queue, model call and answer, and the
batch the model call shared) beside the client's p50/p99, as stacked bars (plots.py) and a small table.

From ``loadtest-report.json`` (`vitdeploy loadtest URL -a EXPORT`) and from the levels `vitdeploy tune` measured
its best settings at (``tune-report.json``). A result without any split (a server that sends no such header: one
from before it, ``serve.stage_timing: false``, gRPC, Triton) is said in one line.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ...base.vocab import SERVER_STAGES, SERVER_TOTAL

#: the stacked segments in the order a request passes them, in words, and what the replica does not account for
STAGE_WORDS = {
    "read": "read (body, parse)",
    "decode": "decode + preprocess",
    "queue": "batch queue",
    "model": "model call",
    "post": "answer built",
}
OUTSIDE = "outside the replica (network, proxy)"
NO_SPLIT = (
    "no stage split: the server sent no Server-Timing header (a server from before it, serve.stage_timing: false, "
    "gRPC or Triton)"
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> Optional[float]:
    """A finite number from a saved result, else None (a hand-edited or older file never breaks the page)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _ms(value: Optional[float], spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


@dataclass(frozen=True)
class SplitLevel:
    """One load level: the client's figures and the server's mean ms per stage (empty: no split came back)."""

    label: str
    throughput: Optional[float]
    p50: Optional[float]
    p99: Optional[float]
    mean: Optional[float]
    stages: Mapping[str, float] = field(default_factory=dict)

    @property
    def batch(self) -> Optional[float]:
        return _num(self.stages.get("batch"))

    @property
    def total(self) -> Optional[float]:
        return _num(self.stages.get(SERVER_TOTAL))

    @property
    def outside(self) -> Optional[float]:
        """The client's mean latency the replica does not account for (network, Ray's proxy and routing)."""
        if self.mean is None or self.total is None:
            return None
        return max(0.0, self.mean - self.total)


def _clients(level: Optional[float]) -> str:
    return f"{_ms(level, 'g')} client" + ("" if level == 1 else "s")


def _stages(raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        return {}
    out = {k: _num(v) for k, v in raw.items() if isinstance(k, str)}
    stages = {k: v for k, v in out.items() if v is not None}
    return stages if any(s in stages for s in (*SERVER_STAGES, SERVER_TOTAL)) else {}


def loadtest_levels(doc: Mapping[str, Any]) -> list[SplitLevel]:
    """The levels of a saved `vitdeploy loadtest` result (LoadReport.to_dict)."""
    out = []
    for lv in doc.get("levels") or []:
        if not isinstance(lv, Mapping):
            continue
        lat = lv.get("latency_ms") if isinstance(lv.get("latency_ms"), Mapping) else {}
        level = _num(lv.get("level"))
        out.append(
            SplitLevel(
                label=f"{_ms(level, 'g')} req/s" if lv.get("mode") == "rate" else _clients(level),
                throughput=_num(lv.get("throughput_rps")),
                p50=_num(lat.get("p50")),
                p99=_num(lat.get("p99")),
                mean=_num(lat.get("mean")),
                stages=_stages(lv.get("server_timing_ms")),
            )
        )
    return out


def tune_levels(trial: Mapping[str, Any]) -> list[SplitLevel]:
    """The levels `vitdeploy tune` measured a trial at (tune-report.json's ``best``)."""
    return [
        SplitLevel(
            label=_clients(_num(lv.get("clients"))),
            throughput=_num(lv.get("rps")),
            p50=_num(lv.get("p50_ms")),
            p99=_num(lv.get("p99_ms")),
            mean=_num(lv.get("mean_ms")),
            stages=_stages(lv.get("server_timing_ms")),
        )
        for lv in trial.get("levels") or []
        if isinstance(lv, Mapping)
    ]


def _plot_args(levels: list[SplitLevel]) -> tuple:
    stacks = [(STAGE_WORDS[s], [lv.stages.get(s, 0.0) for lv in levels]) for s in SERVER_STAGES]
    stacks.append((OUTSIDE, [lv.outside or 0.0 for lv in levels]))
    labels = [lv.label + (f"\nbatch {lv.batch:.1f}" if lv.batch is not None else "") for lv in levels]
    marks = [("client p50", [lv.p50 for lv in levels]), ("client p99", [lv.p99 for lv in levels])]
    return labels, stacks, marks, "ms per request (bars: the mean split)", "load level"


def split_figure(levels: list[SplitLevel]) -> Any:
    """The matplotlib figure of :func:`split_plot` (tests read its bars and markers)."""
    from .plots import stacked_figure

    return stacked_figure(*_plot_args(levels))


def split_plot(levels: list[SplitLevel]) -> str:
    """Stacked bars per level (the server's mean split, then what it does not account for), the client's p50
    and p99 as markers on them: where the latency goes (inline SVG)."""
    from .plots import stacked_bars

    return stacked_bars(*_plot_args(levels))


def split_table(levels: list[SplitLevel]) -> str:
    names = (*SERVER_STAGES, SERVER_TOTAL)
    head = ("level", "requests/s", "client p50 ms", "client p99 ms", *(f"{n} ms" for n in names), "batch", "replica")
    rows = []
    for lv in levels:
        share = f"{100 * lv.total / lv.mean:.0f}%" if lv.total is not None and lv.mean else "-"
        cells = [_ms(_num(lv.stages.get(n))) for n in names] if lv.stages else ["-"] * len(names)
        batch = _ms(lv.batch, ".1f") if lv.stages else "-"
        row = (lv.label, _ms(lv.throughput, ".1f"), _ms(lv.p50), _ms(lv.p99), *cells, batch, share)
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    return (
        "<table class='stages'><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "<p class='muted'>Mean ms per answered request in the replica (Server-Timing); batch: the images the model "
        "call shared; replica: its total as a share of the client's mean latency (the rest: network, proxy, "
        "routing).</p>"
    )


def _block(title: str, levels: list[SplitLevel]) -> str:
    if not levels:
        return ""
    if not any(lv.stages for lv in levels):
        return f"<p class='nosplit'>{_e(title)}: {_e(NO_SPLIT)}.</p>"
    return f"<h4>{_e(title)}</h4><figure>{split_plot(levels)}</figure>{split_table(levels)}"


def _loadtest_title(doc: Mapping[str, Any]) -> str:
    target = doc.get("target") if isinstance(doc.get("target"), Mapping) else {}
    model = f", model {target['model']}" if target.get("model") else ""
    when = f", {doc['created']}" if doc.get("created") else ""
    return f"vitdeploy loadtest of {target.get('url', '?')} ({target.get('protocol', '?')}{model}{when})"


def stage_split_section(facts: Any) -> str:
    """The subsection's HTML: a block per result that ran (tune's best settings, then the last loadtest), or
    the command that measures it."""
    tune, loadtest = facts.tune or {}, facts.loadtest or {}
    best = tune.get("best") if isinstance(tune.get("best"), Mapping) else {}
    blocks = [
        _block("vitdeploy tune: the best settings at each load measured", tune_levels(best)),
        _block(_loadtest_title(loadtest), loadtest_levels(loadtest)),
    ]
    parts = ["<h3 id='stages'>Where a request's time goes</h3>", *blocks]
    if not any(blocks):
        parts.append(
            f"<p class='muted'><code>vitdeploy loadtest URL -a {_e(facts.artifacts)}</code> against a running "
            "<code>vitdeploy serve</code> of this export saves each level's server-side split here.</p>"
        )
    return "".join(parts)


__all__ = [
    "NO_SPLIT",
    "OUTSIDE",
    "STAGE_WORDS",
    "SplitLevel",
    "loadtest_levels",
    "split_figure",
    "split_plot",
    "stage_split_section",
    "tune_levels",
]
