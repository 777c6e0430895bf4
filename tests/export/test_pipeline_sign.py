"""`vitdeploy export --sign-key`: the export is signed once written (model.sig covers what it wrote); a key that
cannot sign is refused before any stage runs; a new export without the key leaves no stale signature."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers.bad_input import assert_one_error_line
from helpers.certs import make_key_pair

from vitdeploy.base.vocab import SIGNATURE_NAME
from vitdeploy.cli import main
from vitdeploy.runtime.signature import read_signature, verify_export

pytest.importorskip("model_signing", reason="the [sign] extra (model-signing) is not installed")
pytestmark = pytest.mark.integration

LEAN = {"export": {"optimize": False, "fp16": {"enabled": False}, "int8": {"enabled": False}}}


def export(checkpoint: Path, out: Path, config: Path, *more: str):
    args = ["export", str(checkpoint), "-o", str(out), "-c", str(config), "--engine", "skip", *more]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_export_signs_what_it_wrote_and_a_new_unsigned_export_drops_the_old_signature(tiny_checkpoint, tmp_path):
    private, public = make_key_pair(tmp_path, "release")
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(LEAN))
    out = tmp_path / "out"
    res = export(tiny_checkpoint, out, config, "--sign-key", str(private))
    assert res.exit_code == 0, res.output
    assert f"signature       {out.resolve() / SIGNATURE_NAME}" in res.stdout
    info = verify_export(out, public)
    assert info.files == ("manifest.json", "model.json", "model.onnx", "model.safetensors")
    assert read_signature(out).signer == "key " + info.verified_with
    res = export(tiny_checkpoint, out, config)  # the same folder, no key: the old signature is not kept
    assert res.exit_code == 0, res.output
    assert not (out / SIGNATURE_NAME).exists()


def test_a_key_that_cannot_sign_is_refused_before_any_stage(tiny_checkpoint, tmp_path):
    _, public = make_key_pair(tmp_path, "release")
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(LEAN))
    res = export(tiny_checkpoint, tmp_path / "out", config, "--sign-key", str(public))
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, "release.pub", "not a PEM private key")
    assert not (tmp_path / "out").exists()
