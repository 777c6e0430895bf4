"""An export whose write fails for the machine's reason (here a file over the process's size limit,
``RLIMIT_FSIZE``: ``EFBIG``, as a full disk gives ``ENOSPC``), in a real subprocess: one line naming the
file as the user would have got it and the cause, exit 1, the export already in the folder untouched
byte for byte (the failed attempt's export-report.json beside it), and no staging folder left behind."""

from __future__ import annotations

import hashlib
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _export(config: Path, out: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    def limited() -> None:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "vitdeploy.cli", "export", "-c", str(config), "-o", str(out), "--engine", "skip"],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limited if limit else None,
    )


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _config(tiny_checkpoint: Path, folder: Path) -> Path:
    config = folder / "pipeline.yaml"
    config.write_text(f"model: {{checkpoint: {tiny_checkpoint}}}\nexport: {{int8: {{enabled: false}}}}\n")
    return config


@pytest.fixture(scope="module")
def previous(tiny_checkpoint, tmp_path_factory) -> Path:
    """The export already in the folder: the same command that fails below, run once for the module and
    copied into each test's folder."""
    folder = tmp_path_factory.mktemp("previous")
    done = _export(_config(tiny_checkpoint, folder), folder / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "out"


@pytest.mark.parametrize("limit, file", [(20_000, "model.safetensors"), (500_000, "model.onnx")])
def test_a_write_that_fails_is_one_line_and_the_previous_export_stays(
    tiny_checkpoint, previous, tmp_path, limit, file
):
    config = _config(tiny_checkpoint, tmp_path)
    out = shutil.copytree(previous, tmp_path / "out")
    before = _digests(out)
    res = _export(config, out, limit)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    errors = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: cannot write {out / file}: File too large (nothing of this export was kept; the export "
        f"already in {out} is untouched)"
    ], res.stdout + res.stderr
    after = _digests(out)
    assert {name: after.get(name) for name in before} == before  # every file of the export there, unchanged
    assert set(after) - set(before) <= {"export-report.json"}  # beside it: the report of the failed attempt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "pipeline.yaml"]  # no staging folder
