"""Signed exports (runtime/signature.py, through the real model-signing library): `vitdeploy sign`, and an export
refused (exit 2, one line naming the file) by `predict --verify-key` / runtime.verify when it is unsigned, signed by
another key, or changed after signing; what our own commands write later never breaks a signature."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers.bad_input import GOOD_IMAGES, assert_one_error_line, edit_manifest, flip_byte, rehash
from helpers.certs import make_key_pair

from vitdeploy.base.errors import SignatureError
from vitdeploy.base.vocab import SIGNATURE_NAME
from vitdeploy.cli import main
from vitdeploy.runtime.artifacts import Artifacts
from vitdeploy.runtime.signature import UNSIGNED, read_signature, sign_export, verify_export

pytest.importorskip("model_signing", reason="the [sign] extra (model-signing) is not installed")

IMAGE = str(GOOD_IMAGES[0])


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    mine, mine_pub = make_key_pair(folder, "mine")
    other, other_pub = make_key_pair(folder, "other")
    return {"mine": mine, "mine.pub": mine_pub, "other": other, "other.pub": other_pub}


@pytest.fixture
def export(tiny_artifacts, tmp_path) -> Path:
    """A copy of the tiny export (unsigned), to sign and tamper with."""
    return shutil.copytree(tiny_artifacts(), tmp_path / "export")


@pytest.fixture
def signed(export, keys) -> Path:
    """The copy, signed with `mine` by `vitdeploy sign`."""
    res = run("sign", export, "--key", keys["mine"])
    assert res.exit_code == 0, res.output
    assert f"signed {export}: 5 files" in res.stdout
    return export


def predict(folder: Path, *args: str):
    return run("predict", IMAGE, "-a", folder, "--json", *args)


def test_a_signed_export_predicts_with_its_key_and_the_signature_covers_every_file_it_wrote(signed, keys):
    res = predict(signed, "--verify-key", keys["mine.pub"])
    assert res.exit_code == 0, res.output
    (record,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert record["label"] and record["top_k"]
    info = read_signature(signed)
    written = sorted(p.name for p in signed.iterdir() if p.name not in UNSIGNED)  # predict may add its own
    assert (
        list(info.files)
        == written
        == ["manifest.json", "model.fp16.onnx", "model.json", "model.onnx", "model.safetensors"]
    )
    assert set(UNSIGNED) <= set(info.ignored)
    assert info.signer == "key " + verify_export(signed, keys["mine.pub"]).verified_with


def _resign_with_other(folder: Path, keys: dict[str, Path]) -> None:
    sign_export(folder, keys["other"])


def _labels(folder: Path, _keys) -> None:
    config = json.loads((folder / "model.json").read_text())
    config["labels"][0] = "pear"
    (folder / "model.json").write_text(json.dumps(config))


def _graph_and_manifest(folder: Path, _keys) -> None:  # what a careful attacker does: the manifest vouches again
    flip_byte(folder / "model.onnx")
    rehash(folder, "onnx")


def _altered_signature(folder: Path, _keys) -> None:  # the signed payload edited: a file's digest replaced
    bundle = json.loads((folder / SIGNATURE_NAME).read_text())
    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    payload["predicate"]["resources"][0]["digest"] = "0" * 64
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    (folder / SIGNATURE_NAME).write_text(json.dumps(bundle))


TAMPERING = {
    "unsigned": (lambda folder, _keys: (folder / SIGNATURE_NAME).unlink(), (SIGNATURE_NAME, "unsigned")),
    "signed by another key": (_resign_with_other, (SIGNATURE_NAME, "another key", "mine.pub")),
    "a byte of the graph": (lambda folder, _keys: flip_byte(folder / "model.onnx"), ("model.onnx", "changed")),
    "the manifest": (lambda folder, _keys: edit_manifest(folder, lambda m: m.update(name="evil")), ("manifest.json",)),
    "the labels file": (_labels, ("model.json", "changed")),
    "graph and manifest": (_graph_and_manifest, ("manifest.json", "changed", "model.onnx")),
    "a file gone": (lambda folder, _keys: (folder / "model.fp16.onnx").unlink(), ("model.fp16.onnx", "missing")),
    "the signature itself": (_altered_signature, (SIGNATURE_NAME, "does not verify")),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_predict_refuses_with_exit_2_and_one_line_naming_the_file(signed, keys, case):
    tamper, needles = TAMPERING[case]
    tamper(signed, keys)
    res = predict(signed, "--verify-key", keys["mine.pub"])
    assert res.exit_code == 2, res.output
    assert res.stdout == ""  # nothing was predicted
    assert_one_error_line(res.stderr, str(signed), *needles)


def test_runtime_verify_in_the_config_does_the_same_with_a_path_relative_to_the_yaml(signed, keys, tmp_path):
    shutil.copy(keys["mine.pub"], tmp_path / "release.pub")
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"runtime": {"verify": {"public_key": "release.pub"}}}))
    assert predict(signed, "-c", config).exit_code == 0
    flip_byte(signed / "model.onnx")
    res = predict(signed, "-c", config)
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, str(signed / "model.onnx"), "changed")


def test_without_the_option_nothing_changes(export, keys):
    plain = predict(export, "-b", "ort")  # one backend both times (auto may measure another one fastest)
    assert plain.exit_code == 0, plain.output
    sign_export(export, keys["other"])  # signed by a key nobody asked about, then changed: not looked at
    edit_manifest(export, lambda m: m.update(created="2030-01-01T00:00:00+00:00"))
    again = predict(export, "-b", "ort")
    assert again.exit_code == 0, again.output
    assert again.stdout == plain.stdout


def test_what_our_commands_write_later_and_files_added_after_signing_do_not_break_it(export, keys):
    (export / "drift-report.json").write_text("{}")  # there when signed, rewritten by `validate` later
    sign_export(export, keys["mine"])
    for name in ("drift-report.json", "report.html", "bench-report.json", "tune-report.json", "loadtest-report.json"):
        (export / name).write_text("written after signing")
    (export / "ort-trt-cache").mkdir()
    (export / "ort-trt-cache" / "engine.bin").write_bytes(b"\0" * 64)
    (export / "notes.txt").write_text("a file someone added: not covered, not refused")
    info = verify_export(export, keys["mine.pub"])
    assert "drift-report.json" not in info.files and "notes.txt" not in info.files
    resigned = sign_export(export, keys["mine"])  # again, over its own model.sig and every later file
    assert resigned.files == (*info.files, "notes.txt")
    assert verify_export(export, keys["mine.pub"]).verified_with


def test_the_library_own_command_verifies_the_signature(signed, keys):
    """Interoperable: `model_signing verify key`, as a platform team runs it, checks our model.sig (and refuses a
    changed export)."""

    def library_verify() -> subprocess.CompletedProcess:
        args = ["--public_key", keys["mine.pub"], "--signature", signed / SIGNATURE_NAME, "--ignore_unsigned_files"]
        command = [sys.executable, "-m", "model_signing", "verify", "key", *map(str, args), str(signed)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    (signed / "report.html").write_text("written after signing")
    ok = library_verify()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    flip_byte(signed / "model.onnx")
    refused = library_verify()
    assert refused.returncode != 0 and "model.onnx" in refused.stdout + refused.stderr


def test_the_signature_is_checked_before_a_byte_of_the_manifest_is_read(signed, keys):
    (signed / "manifest.json").write_text("not json at all")
    with pytest.raises(SignatureError, match="manifest.json: changed since"):
        Artifacts.open(signed, public_key=keys["mine.pub"])


@pytest.mark.parametrize(
    "key, needles",
    [
        ("mine.pub", ("mine.pub", "not a PEM private key")),
        ("missing.pem", ("missing.pem", "no such file", "openssl")),
        ("rsa.pem", ("rsa.pem", "not an elliptic-curve key")),
    ],
)
def test_a_key_that_cannot_sign_is_one_line_exit_2(export, keys, key, needles):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (keys["mine"].parent / "rsa.pem").write_bytes(
        rsa_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    res = run("sign", export, "--key", keys["mine"].parent / key)
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, *needles)
    assert not (export / SIGNATURE_NAME).exists()


def test_an_encrypted_key_signs_with_its_password_from_the_environment(export, tmp_path, monkeypatch):
    private, public = make_key_pair(tmp_path, "locked", password=b"s3cret")
    res = run("sign", export, "--key", private)
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, "locked.pem", "VITDEPLOY_SIGN_KEY_PASSWORD")
    monkeypatch.setenv("VITDEPLOY_SIGN_KEY_PASSWORD", "s3cret")
    assert run("sign", export, "--key", private, "--verify-key", public).exit_code == 0


def test_a_private_key_given_to_verify_and_a_folder_that_is_no_export_are_refused(signed, keys, tmp_path):
    res = predict(signed, "--verify-key", keys["mine"])
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, "mine.pem", "private key")
    res = run("sign", tmp_path, "--key", keys["mine"])
    assert res.exit_code == 2
    assert_one_error_line(res.stderr, "manifest.json", "not an export folder")


def test_a_verified_file_is_hashed_once_and_a_file_changed_after_verification_is_still_refused(
    signed, keys, monkeypatch
):
    from vitdeploy.base.errors import ArtifactIntegrityError
    from vitdeploy.runtime import artifacts as artifacts_module

    hashed: list[str] = []
    real = artifacts_module.sha256_file
    monkeypatch.setattr(artifacts_module, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    opened = Artifacts.open(signed, public_key=keys["mine.pub"])  # the signature's pass serves the manifest check
    assert opened.roles and hashed == []
    Artifacts.open(signed)  # without a key: every file hashed, as ever
    assert sorted(hashed) == ["model.fp16.onnx", "model.json", "model.onnx", "model.safetensors"]
    late = Artifacts.open(signed, verify=False, public_key=keys["mine.pub"])
    flip_byte(signed / "model.onnx")  # after the signature was checked, before the graph is opened
    with pytest.raises(ArtifactIntegrityError, match="model.onnx"):
        late.path("onnx")
