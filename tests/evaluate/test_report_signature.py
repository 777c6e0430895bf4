"""The report's signature section: who signed what (the key's fingerprint, when, the files covered) and whether
the key given (report --verify-key, runtime.verify) verified it; unsigned and refused exports say so."""

from __future__ import annotations

import html
import shutil

import pytest
from click.testing import CliRunner
from helpers.bad_input import flip_byte
from helpers.certs import make_key_pair

pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")
pytest.importorskip("model_signing", reason="the [sign] extra (model-signing) is not installed")

from vitdeploy.cli import main  # noqa: E402
from vitdeploy.runtime.signature import sign_export, verify_export  # noqa: E402


def section(page: str) -> str:
    text = html.unescape(page)
    return text[text.index("<h2 id='signature'>") :].split("<h2", 2)[1]


def report(folder, *more):
    res = CliRunner().invoke(main, ["report", "-a", str(folder), *map(str, more)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return section((folder / "report.html").read_text())


def test_the_report_shows_who_signed_what_and_whether_it_was_verified(tiny_artifacts, tmp_path):
    private, public = make_key_pair(tmp_path, "release")
    folder = shutil.copytree(tiny_artifacts(), tmp_path / "export")
    assert "Unsigned" in report(folder)
    sign_export(folder, private)
    fingerprint = verify_export(folder, public).verified_with
    shown = report(folder)
    assert fingerprint in shown and "not verified" in shown
    assert "5 file(s), sha256: manifest.json, model.fp16.onnx, model.json, model.onnx, model.safetensors" in shown
    assert "report.html" in shown.split("not covered")[1]  # the page itself is written after signing
    verified = report(folder, "--verify-key", public)
    assert "verified" in verified and "not verified" not in verified and "REFUSED" not in verified
    flip_byte(folder / "model.onnx")
    refused = report(folder, "--verify-key", public)
    assert "REFUSED" in refused and "model.onnx: changed since" in refused
