"""The report's "Serving settings" section: what `vitdeploy tune` measured on this machine (tune-report.json),
or the command that measures it; then where a request's time goes in the server, per load level, from tune's
and `vitdeploy loadtest -a`'s results (serving_stages.py)."""

from __future__ import annotations

import html
from typing import Any

from .facts import Facts
from .serving_stages import stage_split_section


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _settings(trial: dict[str, Any]) -> str:
    """The trial's settings in words (``vitdeploy tune`` saves them as "settings")."""
    return str(trial.get("settings") or "?")


def serving_section(facts: Facts) -> str:
    return "<h2 id='serving'>Serving settings</h2>" + _tuned(facts) + stage_split_section(facts)


def _tuned(facts: Facts) -> str:
    parts = []
    tune = facts.tune
    target = (tune or {}).get("target", "serve")
    if not tune or not tune.get("best"):
        parts.append(
            "<p>Not tuned on this machine yet: <code>vitdeploy tune -a "
            f"{_e(facts.artifacts)} --slo-p99-ms 200</code> measures the serve settings here and writes "
            "<code>tuned.yaml</code>.</p>"
        )
        return "".join(parts)
    best, default = tune["best"], tune.get("default") or {}
    parts.append(f"<p class='muted'>Target: {_e(target)}.</p>")
    gain = tune.get("gain_over_default")
    parts.append(
        f"<p><b>{_e(_settings(best))}</b>: {_e(best.get('throughput_rps'))} requests/s, "
        f"p50 {_e(best.get('p50_ms'))} ms, "
        f"p99 {_e(best.get('p99_ms'))} ms at {_e(best.get('clients'))} clients"
        + (
            f", {gain:.2f}x the settings it started from ({_e(default.get('throughput_rps'))} requests/s)"
            if gain
            else ""
        )
        + f". Objective: {_e(tune.get('objective', '?'))}. Overlay: "
        f"<code>{_e(tune.get('overlay', 'tuned.yaml'))}</code> (<code>vitdeploy "
        f"{'triton-repo' if target == 'triton' else 'serve'} -c</code> it).</p>"
    )
    rows = sorted(tune.get("trials", []), key=lambda t: -float(t.get("throughput_rps") or 0))[:8]
    body = "".join(
        f"<tr><td>{_e(_settings(t))}</td><td>{_e(t.get('throughput_rps'))}</td><td>{_e(t.get('p99_ms') or '-')}</td>"
        f"<td>{_e(t.get('how', ''))}</td></tr>"
        for t in rows
    )
    parts.append(
        "<table><thead><tr><th>settings</th><th>requests/s</th><th>p99 ms</th><th>applied</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
        f"<p class='muted'>{len(tune.get('trials', []))} candidates in "
        f"{float(tune.get('seconds', 0)) / 60:.1f} min on {_e(tune.get('cores', '?'))} cores "
        f"({_e(tune.get('stopped', ''))}); the eight fastest shown.</p>"
    )
    return "".join(parts)


__all__ = ["serving_section"]
