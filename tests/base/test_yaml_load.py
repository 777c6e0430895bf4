"""Issue 10, theme 2: a hostile or careless pipeline.yaml is refused quickly, in one short line.

Each case through `vitdeploy config check -c FILE` (exit 2, one `error:` line, no traceback, at
most ~1000 characters) and through `load_config` (ConfigError). Billion laughs must be refused
in well under the 30 s it used to hang for; the bound is loose (shared 2-core machine) but a
regression to the old behaviour would blow it by orders of magnitude.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.base.config import load_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.base.limits import MAX_BATCH
from vitdeploy.cli import main


def laughs(levels: int, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nmodel: {{name: *a{levels - 1}}}\n"


CASES = {
    "billion laughs 9x9": (laughs(9), "anchors and aliases"),
    "laughs 7x9": (laughs(7), "anchors and aliases"),
    "recursive anchor": ("model: &a {name: [*a]}\n", "recursive anchor"),
    "10000 nested flow sequences": ("model: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested more than"),
    "10000 nested mappings": ("model: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n", "nested more than"),
    "integer of 100000 digits": ("export: {opset: " + "9" * 100_000 + "}\n", "cannot be read"),
    "unknown key of 100000 chars": ("model:\n  ? " + "k" * 100_000 + "\n  : 1\n", "unknown key 'model.kkk"),
    "value of 1M chars": ("runtime: {device: '" + "x" * 1_000_000 + "'}\n", "'runtime.device' = 'xxx"),
    "batch max 1e9": ("export: {batch: {max: 1000000000}}\n", f"less than or equal to {MAX_BATCH}"),
    "batch opt 5000": ("export: {batch: {opt: 5000, max: 5000}}\n", "'export.batch.opt' = 5000"),
    "runtime batch_size 1e9": ("runtime: {batch_size: 1000000000}\n", "'runtime.batch_size' = 1000000000"),
    "NaN mean": ("preprocess: {mean: [.nan, 0.5, 0.5]}\n", "'preprocess.mean[0]' = nan"),
    "infinite tolerance": (
        "validation: {fp32: {max_abs_diff: .inf, mean_abs_diff: 0, min_cosine: 1, "
        "min_top1_agreement: 1, min_top5_overlap: 1}}\n",
        "'validation.fp32.max_abs_diff' = inf",
    ),
    "not UTF-8": (b"model: {name: \xff\xfe}\n", "not UTF-8"),
    "a list at the top": ("- model\n- export\n", "top level must be a mapping"),
    "two documents": ("model: {}\n---\nexport: {}\n", "invalid YAML"),
    "tab indentation": ("model:\n\tname: x\n", "invalid YAML"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_yaml_is_one_short_line_and_exit_2(tmp_path: Path, case: str):
    content, needle = CASES[case]
    path = tmp_path / "pipeline.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    tracemalloc.start()
    try:
        res = CliRunner().invoke(main, ["config", "check", "-c", str(path)], catch_exceptions=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # never expanded: measured in bytes (an expanded billion laughs is gigabytes), not in seconds
    assert peak < 64 << 20, f"{peak >> 20} MiB of Python objects"
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.stderr, res.stderr
    assert needle in lines[0] and str(path) in lines[0]
    assert len(lines[0]) < 1000, len(lines[0])
    with pytest.raises(ConfigError, match=None) as info:
        load_config(path)
    assert needle in str(info.value)


def test_file_too_large_is_refused_before_parsing(tmp_path: Path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)


def test_small_aliases_are_still_allowed(tmp_path: Path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        "validation:\n  fp16: &tol {max_abs_diff: 0.1, mean_abs_diff: 0.02, min_cosine: 0.999,\n"
        "    min_top1_agreement: 0.98, min_top5_overlap: 0.9}\n  fp32: *tol\n"
    )
    cfg = load_config(path)
    assert cfg.validation.fp32 == cfg.validation.fp16


@pytest.mark.parametrize("command", [["config", "check"], ["export"], ["predict", "x.jpg"]])
def test_config_naming_a_directory_is_one_clean_line(tmp_path: Path, command: list[str]):
    res = CliRunner().invoke(main, [*command, "-c", str(tmp_path)], catch_exceptions=False)
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [
        f"error: {tmp_path} is a directory; -c/--config takes a pipeline YAML file (e.g. {tmp_path / 'pipeline.yaml'})"
    ]
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_batch_profile_at_the_limit_is_accepted(tmp_path: Path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"export: {{batch: {{min: 1, opt: {MAX_BATCH}, max: {MAX_BATCH}}}}}\n")
    assert load_config(path).export.batch.max == MAX_BATCH
