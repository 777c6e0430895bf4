"""What `vitdeploy tune` writes: ``tuned.yaml``, a pipeline.yaml overlay of the keys it chose (each with its
measured figure as a comment), and ``tune-report.json`` beside the export (every trial; `vitdeploy report`
shows it as its "serving" section).

The overlay is a complete pipeline file (every key it does not name keeps its default): `config check` accepts
it and `serve -c tuned.yaml` uses it as it is; to keep other settings, copy its ``serve:`` (and ``runtime:``)
keys into your own pipeline.yaml.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any, Optional

from ..base.machine import cpu_model
from .search import Trial, TuneResult, objective_text


def _comment(result: TuneResult, best: Trial, key: str, knob: str) -> str:
    """The figures behind ``key``: the best's throughput, and each other value the search tried for its knob
    (the last sweep of that knob: the other settings at the best of their time)."""
    if key == "inference":
        return "  # what was measured: vitdeploy's ONNX Runtime in Triton's python backend"
    if not knob:
        return "  # follows from the keys above"
    chosen, mine = _value(best.candidate, key), best.candidate.overlay_keys()
    tried: dict[Any, str] = {}
    for t in result.trials:
        value = _value(t.candidate, key)
        if value == chosen:
            continue
        differs = {k for (_, k, v, _), (_, _, w, _) in zip(mine, t.candidate.overlay_keys()) if v != w}
        if t.knob in (knob, "defaults") or differs <= {k for _, k, _, kn in mine if kn in (knob, "")}:
            tried[value] = t.figure.summary()
    if not tried:
        return "  # not varied (the budget ran out first)"
    others = ", ".join(f"{_yaml_value(v)}: {text}" for v, text in sorted(tried.items(), key=lambda kv: str(kv[0])))
    return f"  # {best.figure.summary()} (else {others})"


def _value(candidate: Any, key: str) -> Any:
    return next(v for _, k, v, _ in candidate.overlay_keys() if k == key)


def _yaml_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


USE = {"serve": "vitdeploy serve -c tuned.yaml", "triton": "vitdeploy triton-repo -c tuned.yaml"}


def overlay_text(result: TuneResult, artifacts: Path) -> str:
    best, default = result.best, result.default
    assert best is not None
    f = best.figure.best
    lines = [
        f"# vitdeploy tune --target {result.target}: serving settings measured on this machine",
        f"# ({cpu_model()}, {result.cores} usable cores), {_dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"# export: {artifacts}",
        f"# objective: {objective_text(result.slo_p99_ms)}",
    ]
    if f is not None:
        lines.append(
            f"# best: {best.figure.throughput:.1f} req/s, p50 {f.percentile(50):.1f} ms, "
            f"p99 {f.percentile(99):.1f} ms at {int(f.level)} clients ({best.candidate.describe()})"
        )
    else:
        lines.append("# no candidate met the objective: these are the closest (lowest p99) settings measured")
    if default is not None and result.gain:
        lines.append(
            f"# the {result.target} settings it started from: {default.figure.throughput:.1f} req/s "
            f"({result.gain:.2f}x)"
        )
    how = {
        "done": "searched to the end",
        "budget": "stopped by the budget",
        "trials": "stopped at --trials",
        "interrupted": "stopped by Ctrl-C",
    }
    n = len(result.trials)
    lines += [
        f"# {n} candidate{'' if n == 1 else 's'} in {result.seconds / 60:.1f} min ({how[result.stopped]}); "
        "every trial: tune-report.json beside the export",
        f"# Use as it is ({USE[result.target]}) or copy these keys into your pipeline.yaml.",
    ]
    section = None
    for sect, key, value, knob in best.candidate.overlay_keys():
        if sect != section:
            lines.append(f"{sect}:")
            section = sect
        lines.append(f"  {key}: {_yaml_value(value)}{_comment(result, best, key, knob)}")
    return "\n".join(lines) + "\n"


def write_outputs(result: TuneResult, artifacts: Path, out: Path) -> tuple[Optional[Path], Optional[Path]]:
    """Write ``out`` (the overlay; only when a candidate was measured) and tune-report.json beside the export
    (skipped with a warning where that folder is read-only). Returns the paths written."""
    from ..base.vocab import TUNE_REPORT_NAME

    written_overlay = None
    if result.best is not None:
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(overlay_text(result, artifacts), encoding="utf-8")
        os.replace(tmp, out)
        written_overlay = out
    report = Path(artifacts) / TUNE_REPORT_NAME
    try:
        tmp = report.with_name(f".{report.name}.tmp")
        tmp.write_text(json.dumps({**result.to_dict(), "overlay": str(out)}, indent=2), encoding="utf-8")
        os.replace(tmp, report)
    except OSError:
        return written_overlay, None
    return written_overlay, report


__all__ = ["overlay_text", "write_outputs"]
