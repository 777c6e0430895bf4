"""The export as a table (export/pipeline.py ``run_stages``): what the one loop does for every row.

A made-up precision is added as a row, as CONTRIBUTING-export.md says; its "backend" returns the
reference logits, shifted to drift where a test wants it. These tests check the loop's contract
(order, skips, validation, rejection, manifest entries, optional rows), not any real backend: the
real rows run in tests/export/test_pipeline.py and its siblings.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ExportError, ValidationError
from vitdeploy.export.context import ExportContext
from vitdeploy.export.pipeline import STAGES, run_stages
from vitdeploy.export.rows import Artifact, Gate, Stage
from vitdeploy.export.validate import ValidationInputs

ROLE = "onnx-fp16"  # any role of the vocabulary: the made-up row writes its file


class _Logits:
    name = "made-up"

    def __init__(self, reference: np.ndarray, shift: float) -> None:
        self.reference, self.shift = reference, shift

    def run(self, batch: np.ndarray) -> np.ndarray:
        rows = [int(i) for i in batch[:, 0, 0, 0]]  # each input carries its index
        return self.reference[rows] + self.shift

    def close(self) -> None:
        pass


def _reference(ctx: ExportContext, rec) -> tuple:
    ctx.sizes = (1, 3)
    batch = np.arange(4, dtype=np.float32).reshape(4, 1, 1, 1) * np.ones((4, 3, 2, 2), np.float32)
    ctx.inputs = ValidationInputs(batch, tuple(f"noise:{i}" for i in range(4)))
    ctx.reference = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    return ()


def _row(shift: float = 0.0, fail: Exception | None = None, **kwargs) -> Stage:
    def run(ctx: ExportContext, rec) -> tuple:
        if fail:
            raise fail
        path = ctx.path(ROLE)
        path.write_bytes(b"graph")
        rec.reason = "written"
        return (Artifact(ROLE, path),)

    def open_backend(ctx: ExportContext, made) -> _Logits:
        return _Logits(ctx.reference, shift)

    return Stage("made-up", run, roles=(ROLE,), gate=Gate("validate-made-up", "fp16", open_backend), **kwargs)


def _context(tmp_path, **kwargs) -> tuple[ExportContext, list]:
    seen: list = []
    ctx = ExportContext(
        parse_config({}, None), tmp_path, "skip", lambda rec: seen.append((rec.name, rec.status)), **kwargs
    )
    return ctx, seen


def test_the_table_runs_the_stages_users_see_in_order():
    assert [s.name for s in STAGES] == [
        "model",
        "onnx",
        "reference",
        "ort-optimize",
        "fp16",
        "int8",
        "bf16",
        "engine",
        "int8-trt",
        "engine-int8",
        "manifest",
    ]
    assert {s.gate.name for s in STAGES if s.gate} == {
        "validate-onnx",
        "validate-ort-optimized",
        "validate-fp16",
        "validate-int8",
        "validate-bf16",
        "validate-int8-trt",
        "validate-engine",
        "validate-engine-int8",
    }


def test_an_added_row_is_timed_validated_and_recorded_in_the_manifest_entries(tmp_path):
    ctx, seen = _context(tmp_path)
    run_stages(ctx, [Stage("reference", _reference), _row(shift=1e-4)])
    assert seen == [
        ("reference", "running"),
        ("reference", "passed"),
        ("made-up", "running"),
        ("made-up", "passed"),
        ("validate-made-up", "running"),
        ("validate-made-up", "passed"),
    ]
    assert ctx.stages[1].outputs == [tmp_path / "model.fp16.onnx"] and ctx.stages[1].reason == "written"
    assert ctx.stages[2].reason.startswith("4 inputs at batch 3, 4 inputs at batch 1; worst max|diff| 0.0001")
    assert ctx.artifacts == {ROLE: tmp_path / "model.fp16.onnx"} and ctx.entries[ROLE]["bytes"] == 5
    assert ctx.validation["validate-made-up"]["passed"] is True
    assert set(ctx.validation["validate-made-up"]["per_batch"]) == {"1", "3"}


def test_an_artifact_made_before_the_reference_is_validated_right_after_it(tmp_path):
    ctx, seen = _context(tmp_path)
    run_stages(ctx, [_row(), Stage("reference", _reference)])
    assert [name for name, status in seen if status != "running"] == ["made-up", "reference", "validate-made-up"]
    assert ROLE in ctx.artifacts


def test_a_drifting_artifact_is_renamed_rejected_reported_and_fails_the_export(tmp_path):
    ctx, seen = _context(tmp_path, final_dir=tmp_path / "final")
    with pytest.raises(ValidationError, match=r"^validate-made-up: made-up output drifted .*final/export-report.json"):
        run_stages(ctx, [Stage("reference", _reference), _row(shift=5.0)])
    assert seen[-1] == ("validate-made-up", "failed") and ROLE not in ctx.artifacts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export-report.json", "model.fp16.onnx.rejected"]
    report = json.loads((tmp_path / "export-report.json").read_text())
    assert report["passed"] is False and report["validation"]["validate-made-up"]["passed"] is False


@pytest.mark.parametrize("required", [False, True])
def test_an_optional_row_that_fails_is_dropped_unless_required(tmp_path, required, caplog):
    ctx, seen = _context(tmp_path)
    row = _row(
        shift=5.0,
        fallible=(ValidationError,),
        required=lambda ctx: required,
        dropped=lambda ctx, exc: logging.getLogger("made-up").warning("made-up not written: %s", exc),
    )
    table = [Stage("reference", _reference), row, Stage("after", lambda ctx, rec: ())]
    run_stages(ctx, table)
    assert seen[-3:] == [("validate-made-up", "failed"), ("after", "running"), ("after", "passed")]
    assert ROLE not in ctx.artifacts
    if required:  # refused: recorded, the rest goes on, the drifting file kept as *.rejected to inspect
        assert [(r.stage, type(r.error)) for r in ctx.refused] == [("made-up", ValidationError)]
        assert ctx.extra["refused"][0]["artifacts"] == ["model.fp16.onnx"]
        assert [p.name for p in tmp_path.glob("model.fp16.onnx*")] == ["model.fp16.onnx.rejected"]
        return
    assert not ctx.refused
    assert seen[-3:] == [("validate-made-up", "failed"), ("after", "running"), ("after", "passed")]
    assert ROLE not in ctx.artifacts and not list(tmp_path.glob("model.fp16.onnx*"))  # nor its *.rejected
    assert "made-up not written: validate-made-up: made-up output drifted" in caplog.text


def test_a_skipped_row_leaves_one_record_and_a_row_that_does_not_apply_none(tmp_path):
    ctx, seen = _context(tmp_path)
    run_stages(
        ctx,
        [
            Stage("reference", _reference),
            _row(skip=lambda ctx: "export.made_up is false"),
            _row(applies=lambda ctx: False, fail=ExportError("never run")),
        ],
    )
    assert seen[2:] == [("made-up", "skipped")] and ctx.stages[-1].reason == "export.made_up is false"
    assert not ctx.artifacts


def test_a_row_that_declines_to_ship_its_validated_artifact_leaves_it_out(tmp_path):
    ctx, _ = _context(tmp_path)
    run_stages(ctx, [Stage("reference", _reference), _row(ships=lambda ctx, made: False)])
    assert ctx.validation["validate-made-up"]["passed"] and not ctx.artifacts
    assert not (tmp_path / "model.fp16.onnx").exists()
