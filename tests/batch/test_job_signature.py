"""`vitdeploy batch-predict --verify-key`: an export its key did not sign is refused before Ray starts (exit 2)."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from helpers.bad_input import GOOD_IMAGES, assert_one_error_line
from helpers.certs import make_key_pair

from vitdeploy.cli import main
from vitdeploy.runtime.signature import sign_export

pytest.importorskip("model_signing", reason="the [sign] extra (model-signing) is not installed")


def test_batch_predict_refuses_an_export_signed_by_another_key_before_any_work(tiny_artifacts, tmp_path):
    _, public = make_key_pair(tmp_path, "release")
    other, _ = make_key_pair(tmp_path, "other")
    folder = shutil.copytree(tiny_artifacts(), tmp_path / "export")
    sign_export(folder, other)
    out = tmp_path / "out.jsonl"
    args = ["batch-predict", str(GOOD_IMAGES[0]), "-a", str(folder), "-o", str(out), "--verify-key", str(public)]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert_one_error_line(res.stderr, "model.sig", "another key", "release.pub")
    assert not out.exists()
