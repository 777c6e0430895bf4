"""`vitdeploy rollout --verify-key`: a new export its key did not sign is refused before the server is asked anything
(exit 2, one line naming the file)."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from helpers.bad_input import assert_one_error_line
from helpers.certs import make_key_pair

from vitdeploy.base.vocab import SIGNATURE_NAME
from vitdeploy.cli import main

pytest.importorskip("model_signing", reason="the [sign] extra (model-signing) is not installed")


def test_rollout_refuses_an_unsigned_export_before_touching_the_server(tiny_artifacts, tmp_path):
    _, public = make_key_pair(tmp_path, "release")
    folder = shutil.copytree(tiny_artifacts(), tmp_path / "export")
    url = "http://127.0.0.1:9"  # nothing listens: the refusal must come first
    args = ["rollout", url, "-a", str(folder), "--address", "127.0.0.1:9", "--verify-key", str(public)]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert_one_error_line(res.stderr, str(folder / SIGNATURE_NAME), "unsigned")
