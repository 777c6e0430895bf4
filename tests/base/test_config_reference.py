"""docs/configuration.md is `vitdeploy config reference`'s output, generated from the config models."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from vitdeploy.base.config import SECTIONS
from vitdeploy.base.config_reference import reference_markdown, undocumented_keys
from vitdeploy.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
REGENERATE = "regenerate it: .venv/bin/vitdeploy config reference > docs/configuration.md"


def test_the_committed_reference_is_the_commands_output():
    res = CliRunner().invoke(main, ["config", "reference"], catch_exceptions=False)
    assert res.exit_code == 0
    assert DOC.is_file(), f"{DOC} is missing; {REGENERATE}"
    assert DOC.read_text(encoding="utf-8") == res.stdout, f"{DOC} differs from the config models; {REGENERATE}"


def test_every_key_has_a_meaning_and_every_section_is_there():
    assert undocumented_keys() == []
    text = reference_markdown()
    assert all(f"## `{name}`" in text for name in SECTIONS)
    assert "| `validation.fp16.max_abs_diff` | float | `0.1` |" in text  # nested defaults read off the section
    assert "| `export.int8.min_speedup` | float | `1.3` |" in text
