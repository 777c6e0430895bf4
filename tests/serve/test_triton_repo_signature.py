"""`vitdeploy triton-repo --verify-key` (runtime.verify): the export's signature is checked before the repository
is written; an unsigned or changed export leaves no repository (exit 2, one line naming the file)."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from helpers.bad_input import assert_one_error_line, edit_manifest
from helpers.certs import make_key_pair

from vitdeploy.cli import main
from vitdeploy.runtime.signature import sign_export

pytest.importorskip("model_signing", reason="the [sign] extra (model-signing) is not installed")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_triton_repo_writes_a_signed_export_and_refuses_it_once_changed(tiny_artifacts, tmp_path):
    private, public = make_key_pair(tmp_path, "release")
    folder = shutil.copytree(tiny_artifacts(), tmp_path / "export")
    sign_export(folder, private)
    res = run("triton-repo", "-a", folder, "-o", tmp_path / "repo", "--verify-key", public)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "repo" / "tiny").is_dir()
    edit_manifest(folder, lambda m: m["labels"].reverse())
    res = run("triton-repo", "-a", folder, "-o", tmp_path / "again", "--verify-key", public)
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, str(folder / "manifest.json"), "changed since")
    assert not (tmp_path / "again").exists()
