"""`vitdeploy serve --verify-key` (runtime.verify): an export its key did not sign, or changed since, is refused
before anything starts (exit 2, one line naming the file; no Ray); a signed one passes the same check."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from helpers.bad_input import assert_one_error_line, flip_byte
from helpers.certs import make_key_pair

from vitdeploy.base.vocab import SIGNATURE_NAME
from vitdeploy.cli import main
from vitdeploy.runtime.signature import sign_export

pytest.importorskip("model_signing", reason="the [sign] extra (model-signing) is not installed")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def signed(tiny_artifacts, tmp_path):
    private, public = make_key_pair(tmp_path, "release")
    folder = shutil.copytree(tiny_artifacts(), tmp_path / "export")
    sign_export(folder, private)
    return folder, public


def test_serve_refuses_to_start_an_export_changed_after_signing(signed, tmp_path):
    folder, public = signed
    flip_byte(folder / "model.onnx")
    res = run("serve", "-a", folder, "--verify-key", public, "--port", "1")  # never listens: refused first
    assert res.exit_code == 2, res.output
    assert_one_error_line(res.stderr, str(folder / "model.onnx"), "changed since")
    assert "Ray" not in res.stderr


def test_serve_refuses_an_unsigned_export_and_writes_no_deploy_config_for_it(signed, tmp_path):
    folder, public = signed
    config = tmp_path / "serve.yaml"
    assert run("serve", "-a", folder, "--verify-key", public, "--write-config", config).exit_code == 0
    assert config.is_file()  # signed: the deploy config is written
    config.unlink()
    (folder / SIGNATURE_NAME).unlink()
    res = run("serve", "-a", folder, "--verify-key", public, "--write-config", config)
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, str(folder / SIGNATURE_NAME), "unsigned")
    assert not config.exists()


def test_a_remote_uri_with_verify_key_is_refused_naming_what_to_do(signed, tmp_path):
    _, public = signed
    res = run("serve", "-a", "s3://bucket/export", "--verify-key", public, "--write-config", tmp_path / "s.yaml")
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, "s3://bucket/export", "on this machine")
