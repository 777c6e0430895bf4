"""export/staging.py on plain files: the swap, its fallback, and which leftovers are ours to clean."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vitdeploy.base.vocab import EXPORT_REPORT_NAME
from vitdeploy.export import staging
from vitdeploy.export.pipeline import _OUR_NAMES


def make_export(d: Path, tag: str, *, engine: bool = False) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "model.safetensors", "manifest.json", *(["model.engine"] if engine else [])):
        (d / name).write_text(f"{tag} {name}")


@pytest.mark.parametrize("exchange", [True, False], ids=["atomic exchange", "file-by-file fallback"])
def test_commit_replaces_our_files_and_keeps_the_users(tmp_path, monkeypatch, exchange):
    final = tmp_path / "out"
    make_export(final, "old", engine=True)
    (final / "model.onnx.rejected").write_text("old reject")
    (final / EXPORT_REPORT_NAME).write_text("old report")
    (final / "mine.txt").write_text("user")
    (final / "sub").mkdir()
    (final / "sub" / "deep.txt").write_text("user deep")
    if not exchange:
        monkeypatch.setattr(staging, "_exchange", lambda a, b: False)
    with staging.staged(final, _OUR_NAMES, EXPORT_REPORT_NAME) as (stage, beside):
        assert beside and stage.parent == tmp_path
        make_export(stage, "new")
        staging.commit(stage, final, beside, _OUR_NAMES)
    assert sorted(p.name for p in final.iterdir()) == [
        "manifest.json",
        "mine.txt",
        "model.onnx",
        "model.safetensors",
        "sub",
    ]
    assert (final / "model.onnx").read_text() == "new model.onnx"
    assert (final / "mine.txt").read_text() == "user" and (final / "sub" / "deep.txt").read_text() == "user deep"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_first_export_is_a_plain_rename(tmp_path):
    final = tmp_path / "new"
    final.mkdir()
    final.rmdir()
    with staging.staged(final, _OUR_NAMES, EXPORT_REPORT_NAME) as (stage, beside):
        make_export(stage, "new")
        staging.commit(stage, final, beside, _OUR_NAMES)
    assert (final / "manifest.json").read_text() == "new manifest.json"


def test_failure_publishes_report_and_rejects_and_leaves_the_old_export(tmp_path):
    final = tmp_path / "out"
    make_export(final, "old")
    with pytest.raises(RuntimeError):
        with staging.staged(final, _OUR_NAMES, EXPORT_REPORT_NAME) as (stage, _):
            make_export(stage, "new")
            (stage / EXPORT_REPORT_NAME).write_text("why")
            (stage / "model.fp16.onnx.rejected").write_text("drifted")
            raise RuntimeError("stage failed")
    assert (final / "manifest.json").read_text() == "old manifest.json"
    assert (final / EXPORT_REPORT_NAME).read_text() == "why" and (final / "model.fp16.onnx.rejected").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_clean_stale_removes_only_our_leftovers(tmp_path):
    final = tmp_path / "out"
    make_export(final, "old")
    ours = [final / ".model.onnx.ab12cd34.tmp", final / ".manifest.json.zz_99xyz.tmp", final / ".fp16-probe-abcdefgh"]
    ours[0].write_text("x")
    ours[1].write_text("x")
    ours[2].mkdir()
    (final / ".model.onnx.qq11ww22").mkdir()  # save_onnx_atomic's staging folder
    dead = tmp_path / ".out.vitdeploy-staging-99999999-abcdefgh"
    dead.mkdir()
    alive = tmp_path / f".out.vitdeploy-staging-{os.getppid()}-abcdefgh"  # a running export: left alone
    alive.mkdir()
    keep = [final / ".gitignore", final / ".mine.txt.ab12cd34.tmp", final / ".model.onnx.tmp", tmp_path / ".other"]
    for p in keep:
        p.write_text("not ours")
    other_out = tmp_path / ".elsewhere.vitdeploy-staging-99999999-abcdefgh"  # another folder's staging
    other_out.mkdir()
    removed = staging.clean_stale(final, _OUR_NAMES)
    assert sorted(removed) == sorted([*ours, final / ".model.onnx.qq11ww22", dead])
    assert all(p.exists() for p in [*keep, alive, other_out])
