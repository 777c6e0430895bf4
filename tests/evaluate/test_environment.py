"""`vitdeploy info`: aligned rows, and ort-fp16 described so it agrees with predict's auto choice."""

from __future__ import annotations

import re

from click.testing import CliRunner

from vitdeploy.cli import main


def _section(lines: list[str], title: str) -> list[str]:
    start = lines.index(title) + 1
    rows = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        rows.append(line)
    return rows


def test_info_rows_are_aligned_and_ort_fp16_says_what_it_is_for_on_a_cpu():
    from vitdeploy.runtime.predictor import cuda_provider_available

    res = CliRunner().invoke(main, ["info"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for title in ("libraries:", "backends:"):
        rows = _section(lines, title)
        assert len(rows) >= 5, (title, rows)
        # the second column starts at the same place on every row
        starts = {re.match(r"  \S+ +", row).end() for row in rows}
        assert len(starts) == 1, rows
    backends = {row.split()[0]: row for row in _section(lines, "backends:")}
    assert set(backends) >= {"torch", "ort", "ort-fp16", "trt", "torch-fp16"}
    if not cuda_provider_available():  # this machine: predict's auto passes ort-fp16 over for ort
        assert "check the FP16 graph" in backends["ort-fp16"] and "slower than ort" in backends["ort-fp16"]
