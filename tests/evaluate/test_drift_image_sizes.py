"""`vitdeploy validate` on an export for several sizes (``sized_artifacts``: a tiny DINOv2 with registers at 28, 42
and 56 px): each backend judged at every listed size against eager PyTorch at that size, one row per backend and
size in the table, in drift-report.json and on the report page; ``--image-size`` judges one size, a size the export
does not list is refused naming those that work; a failure at one size is named with its size."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.base.errors import ValidationError
from vitdeploy.cli import main
from vitdeploy.evaluate.drift_report import BackendDrift, DriftReport
from vitdeploy.evaluate.drift_table import format_drift_table

SIZES = [28, 42, 56]


@pytest.fixture(scope="module")
def sized(sized_artifacts: Path, tmp_path_factory) -> dict:
    """A copy of the sized export (validate writes its report there) and three images of other shapes."""
    from PIL import Image

    root = tmp_path_factory.mktemp("drift_sizes")
    export = root / "export"
    shutil.copytree(sized_artifacts, export)
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(5)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (40 + 9 * i, 50, 3), dtype=np.uint8)).save(images / f"im{i}.png")
    return {"export": export, "images": images}


def _validate(sized: dict, *args: str):
    return CliRunner().invoke(main, ["validate", "-a", str(sized["export"]), "--images", str(sized["images"]), *args])


def _table_rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.split()[:1] in (["torch"], ["ort"])]


@pytest.mark.integration
def test_every_backend_is_judged_at_every_size_in_the_table_the_json_and_the_page(sized):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")
    from vitdeploy.evaluate.report import write_report

    write_report(sized["export"], images=False)  # validate refreshes an existing page
    res = _validate(sized, "-b", "torch,ort")
    assert res.exit_code == 0, res.output
    assert [row[:2] for row in _table_rows(res.output)] == [[b, str(s)] for b in ("torch", "ort") for s in SIZES]
    assert "2 backend(s) ran at 28, 42, 56 px" in res.output

    doc = json.loads((sized["export"] / "drift-report.json").read_text())
    assert doc["image_sizes"] == SIZES and sorted(doc["reference"]["per_size"]) == ["28", "42", "56"]
    ort = {b["image_size"]: b for b in doc["backends"] if b["name"] == "ort"}
    assert sorted(ort) == SIZES
    for size, row in ort.items():  # judged against eager at the same size: a mix-up of sizes could not pass
        assert row["status"] == "passed", (size, row["failures"])
        assert row["metrics"]["max_abs_diff"] < 1e-4 and row["metrics"]["patch_cosine"] > 0.9999, size

    accuracy = (sized["export"] / "report.html").read_text(encoding="utf-8")
    accuracy = accuracy[accuracy.index("<h2 id='accuracy'>") :]
    assert "<th>backend</th><th>size</th><th>verdict</th>" in accuracy
    for size in SIZES:
        assert f"<tr><td>ort</td><td>{size} px</td>" in accuracy


@pytest.mark.integration
def test_image_size_judges_one_size_and_an_unlisted_size_is_refused_naming_the_sizes(sized):
    res = _validate(sized, "-b", "ort", "--image-size", "42", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["image_sizes"] == [42] and [(b["name"], b["image_size"]) for b in doc["backends"]] == [("ort", 42)]

    res = _validate(sized, "-b", "ort", "--image-size", "35")
    assert res.exit_code == 2
    assert "image size 35" in res.output and "sizes that work: 28, 42, 56" in res.output
    assert "Traceback" not in res.output


def test_a_failure_at_one_size_is_named_with_its_size():
    def row(size: int, failures: list[str]) -> BackendDrift:
        status = "failed" if failures else "passed"
        return BackendDrift("ort", status, metrics={"max_abs_diff": 0.5}, failures=failures, image_size=size)

    report = DriftReport(
        artifacts="x",
        model="m",
        images={"source": "imgs", "evaluated": 2, "labelled": 0, "label_source": "none", "unreadable": []},
        reference={"describe": "torch", "accuracy": None},
        thresholds={"fp32": {}},
        backends=[
            row(28, []),
            row(42, ["max_abs_diff 0.5 > 0.001"]),
            BackendDrift("trt", "unavailable", "fp16", reason="no engine"),
        ],
        image_sizes=[28, 42],
    )
    lines = format_drift_table(report)
    assert [line.split()[:2] for line in lines if line.startswith(("ort", "trt"))] == [
        ["ort", "28"],
        ["ort", "42"],
        ["trt", "all"],  # cannot run here: one row for every size
    ]
    assert "  ort at 42 px FAIL max_abs_diff 0.5 > 0.001" in lines
    assert lines[-1].startswith("FAILED (ort at 42 px): 1 backend(s) ran at 28, 42 px")
    with pytest.raises(ValidationError, match=r"ort at 42 px: max_abs_diff 0.5 > 0.001"):
        report.raise_for_failures()
    assert report.backend("ort", 42).failures and not report.backend("ort", 28).failures
