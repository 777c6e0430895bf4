"""The drift suite's summary: how many backends ran here and which were skipped, and why.

Every outcome of a ``test_backend_drift[...]`` case is collected (xdist workers' reports reach
the controller through the same hook) and printed once at the end of the run:

    drift: 3 backends ran, 3 skipped: torch-fp32-cuda (...), torch-fp16-cuda (...), trt (...)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_OUTCOMES: dict[str, tuple[str, str]] = {}  # case id -> (outcome, skip reason)
_CASE = re.compile(r"test_drift\.py::test_backend_drift\[(?P<case>[^\]]+)\]")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "").strip().splitlines()[-1] if longrepr else ""


def pytest_runtest_logreport(report) -> None:
    match = _CASE.search(report.nodeid)
    if not match:
        return
    case = match.group("case")
    if report.skipped:
        _OUTCOMES[case] = ("skipped", _skip_reason(report))
    elif report.failed:
        _OUTCOMES[case] = ("failed", "")
    elif report.when == "call" and case not in _OUTCOMES:
        _OUTCOMES[case] = ("passed", "")


def drift_summary() -> str | None:
    if not _OUTCOMES:
        return None
    ran = [c for c, (o, _) in _OUTCOMES.items() if o in ("passed", "failed")]
    failed = [c for c, (o, _) in _OUTCOMES.items() if o == "failed"]
    skipped = [(c, why) for c, (o, why) in _OUTCOMES.items() if o == "skipped"]
    line = f"drift: {len(ran)} backends ran ({', '.join(ran) or 'none'})"
    if failed:
        line += f", {len(failed)} failed ({', '.join(failed)})"
    line += f", {len(skipped)} skipped"
    if skipped:
        line += ": " + "; ".join(f"{c} ({why.removeprefix(c + ': ')})" for c, why in skipped)
    return line


def pytest_terminal_summary(terminalreporter) -> None:
    line = drift_summary()
    if line:
        terminalreporter.write_sep("-", "drift backends")
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def drift_artifacts(demo_artifacts, tmp_path_factory) -> Path:
    """The demo export; with a TensorRT engine where TensorRT and a CUDA GPU exist, so the trt
    case runs there (the shared demo_artifacts fixture skips the engine to stay fast on CPU)."""
    from vitdeploy.runtime.backends import BackendOptions, backend_unavailable_reason

    if backend_unavailable_reason("trt", None, BackendOptions(device="cuda")):
        return demo_artifacts
    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    out = tmp_path_factory.mktemp("demo_artifacts_engine")
    run_export(parse_config({"export": {"int8": {"min_speedup": 0}}}, None), out, engine="require")
    return out
