"""Signed exports: a signature over an export folder, and its check before anything in the folder is used.

Through OpenSSF Model Signing (the ``model-signing`` package, the ``[sign]`` extra): ``model.sig`` beside the
manifest is a Sigstore bundle whose signed payload lists every covered file with its sha256 digest; the
elliptic-curve key (P-256, P-384 or P-521, a PEM file) signs it. ``model_signing verify key`` checks the same
file, whatever vitdeploy version wrote it.

What a signature covers: every file in the folder when it is signed (``manifest.json``, every graph, engine,
weights, ``model.json``, ``*.rejected`` copies, anything else there), except :data:`UNSIGNED`: the files vitdeploy's
own commands write or rewrite in an export folder after the export (the signature itself, ``validate``'s drift
report, ``report``'s page, ``bench``'s, ``tune``'s and ``loadtest``'s results, a failed export's report, the
TensorRT timing cache, ONNX Runtime's TensorRT EP cache). The signature names them as ignored.

What :func:`verify_export` refuses (:class:`SignatureError`, one line naming the file, exit 2): no ``model.sig``,
a signature by another key or one whose bytes were altered, a covered file changed, missing or replaced by a
link. A file added after signing is neither covered nor refused: nothing vitdeploy loads lies outside what the
signed manifest names (every file a backend opens is listed there with its sha256, checked by ``artifacts``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import hashlib
import io
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ..base._deps import require
from ..base._files import file_state
from ..base.errors import ArtifactError, ConfigError, SignatureError, first_line
from ..base.limits import clip
from ..base.vocab import (
    AUTO_CHOICE_NAME,
    BENCH_REPORT_NAME,
    DRIFT_REPORT_NAME,
    EXPORT_REPORT_NAME,
    LOADTEST_REPORT_NAME,
    MANIFEST_NAME,
    REPORT_NAME,
    SIGNATURE_NAME,
    TIMING_CACHE_NAME,
    TRT_EP_CACHE,
    TUNE_REPORT_NAME,
)

log = logging.getLogger(__name__)

#: What a signature never covers: what vitdeploy's own commands write or rewrite in an export folder later.
UNSIGNED: tuple[str, ...] = (
    SIGNATURE_NAME,
    DRIFT_REPORT_NAME,
    REPORT_NAME,
    BENCH_REPORT_NAME,
    TUNE_REPORT_NAME,
    LOADTEST_REPORT_NAME,
    EXPORT_REPORT_NAME,
    TIMING_CACHE_NAME,
    TRT_EP_CACHE,
    AUTO_CHOICE_NAME,  # what auto measured here: it only orders candidates that passed their gates
)
#: The covered files' digest: the library's default, the one `model_signing verify key` checks (its command
#: line never reads the algorithm from the signature); files are hashed in parallel, one per thread
HASH = "sha256"
#: The private key's password, for an encrypted PEM (never a command-line argument: it would show in `ps`).
PASSWORD_ENV = "VITDEPLOY_SIGN_KEY_PASSWORD"
MAX_SIGNATURE_BYTES = 16 << 20  # a bundle lists every file's name and digest: kilobytes
_CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what Sigstore's bundle format (and the library) accepts
_NEW_KEY = (
    "make a key pair: openssl ecparam -genkey -name prime256v1 -noout | openssl pkcs8 -topk8 -nocrypt -out "
    "private.pem && openssl ec -in private.pem -pubout -out public.pem"
)


@dataclasses.dataclass(frozen=True)
class SignatureInfo:
    """What ``model.sig`` says: who signed (the key's fingerprint), when (the file's time), what it covers."""

    path: str
    signer: str  # "key sha256:<64 hex>": sha256 of the public key's PEM, the bundle's key hint
    signed_at: str  # model.sig's modification time, ISO 8601 UTC (a key signature holds no time of its own)
    algorithm: str  # the covered files' digest
    files: tuple[str, ...]  # covered, relative to the folder
    ignored: tuple[str, ...]  # named as never covered
    verified_with: str | None = None  # the fingerprint of the key it was verified with here; None: not verified
    #: each covered file's digest as signed (hex; sha256, the manifest's own, when ``algorithm`` is HASH)
    digests: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    #: after a verification: each covered file's state (file_state) while the library hashed it; what lets
    #: ``Artifacts`` take a verified file's sha256 as read instead of hashing it a second time
    states: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def short_signer(self) -> str:
        kind, _, fingerprint = self.signer.partition(" ")
        return f"{kind} {fingerprint[:23]}" if fingerprint.startswith("sha256:") else self.signer

    def to_dict(self) -> dict[str, Any]:
        data = {**dataclasses.asdict(self), "files": list(self.files), "ignored": list(self.ignored)}
        data.pop("states")
        data["digests"] = dict(self.digests)
        return data


def fingerprint(key: Any) -> str:
    """``sha256:<hex>`` of a public key's PEM (SubjectPublicKeyInfo): the hint a bundle carries (the library's)."""
    from cryptography.hazmat.primitives import serialization

    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(pem).hexdigest()


def load_private_key(path: str | os.PathLike[str], what: str = "signing key") -> Any:
    """The elliptic-curve private key in the PEM file ``path`` (its password from $VITDEPLOY_SIGN_KEY_PASSWORD);
    ConfigError naming the file when it is missing, encrypted without a password, or not such a key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path).expanduser()
    data = _read_key(path, what)
    password = os.environ.get(PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(data, password.encode("utf-8") if password else None)
    except TypeError:  # encrypted and no password, or a password for a key that has none
        need = "is encrypted: set its password in" if not password else "is not encrypted: unset"
        raise ConfigError(f"{what} {path}: the private key {need} ${PASSWORD_ENV}") from None
    except ValueError as exc:
        raise ConfigError(
            f"{what} {path}: not a PEM private key, or a wrong password ({first_line(exc, 200)}); {_NEW_KEY}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in _CURVES:
        raise ConfigError(f"{what} {path}: not an elliptic-curve key on P-256, P-384 or P-521; {_NEW_KEY}")
    return key


def load_public_key(path: str | os.PathLike[str], what: str = "public key") -> Any:
    """The elliptic-curve public key in the PEM file ``path``; ConfigError naming the file otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path).expanduser()
    try:
        key = serialization.load_pem_public_key(_read_key(path, what))
    except ValueError as exc:
        hint = " (that is a private key: give its public half)" if b"PRIVATE KEY" in _read_key(path, what) else ""
        raise ConfigError(f"{what} {path}: not a PEM public key{hint} ({first_line(exc, 200)})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in _CURVES:
        raise ConfigError(f"{what} {path}: not an elliptic-curve public key on P-256, P-384 or P-521")
    return key


def _read_key(path: Path, what: str) -> bytes:
    return _read_small(path, 1 << 20, ConfigError, f"{what} {path}", "not a PEM key", f"no such file; {_NEW_KEY}")


def _read_small(path: Path, limit: int, error: type[Exception], named: str, kind: str, missing: str) -> bytes:
    """``path``'s bytes, at most ``limit`` of them; else ``error`` saying ``named``: over the limit (not a
    ``kind``), ``missing``, or why it could not be read."""
    try:
        if path.stat().st_size > limit:
            raise error(f"{named}: over {limit} bytes, {kind}")
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{named}: {missing}") from None
    except OSError as exc:
        raise error(f"{named}: cannot read it ({exc.strerror or exc})") from None


def check_sign_key(private_key: str | os.PathLike[str], what: str = "signing key") -> None:
    """Before a long export that ends signed: the key loads, and the library is installed."""
    load_private_key(private_key, what)
    require("model_signing", "signing an export")


def _export_folder(directory: str | os.PathLike[str]) -> Path:
    folder = Path(directory).expanduser().resolve()
    if not (folder / MANIFEST_NAME).is_file():
        raise ArtifactError(f"{folder} holds no {MANIFEST_NAME}: not an export folder (`vitdeploy export` writes one)")
    return folder


def sign_export(directory: str | os.PathLike[str], private_key: str | os.PathLike[str]) -> SignatureInfo:
    """Sign the export folder ``directory`` with the elliptic-curve key in ``private_key`` (PEM): write
    ``model.sig`` (complete or not at all) over every file there but :data:`UNSIGNED`."""
    from ..base._files import write_bytes_atomic

    folder = _export_folder(directory)
    key_path = Path(private_key).expanduser()
    load_private_key(key_path)  # one line naming the key file before any hashing
    ms = require("model_signing", "signing an export")
    hashing = ms.hashing.Config().use_file_serialization(hashing_algorithm=HASH).set_ignored_paths(paths=UNSIGNED)
    password = os.environ.get(PASSWORD_ENV)
    secret = password.encode("utf-8") if password else None  # bytes: the library hands it to cryptography as it is
    config = (
        ms.signing.Config().set_hashing_config(hashing).use_elliptic_key_signer(private_key=key_path, password=secret)
    )
    with tempfile.TemporaryDirectory(prefix="vitdeploy-sign-") as tmp:  # never a file in the folder being hashed
        bundle = Path(tmp) / SIGNATURE_NAME
        try:
            config.sign(folder, bundle)
        except ValueError as exc:  # a link or a special file in the folder
            raise ArtifactError(f"cannot sign {folder}: {first_line(exc, 300)}") from None
        write_bytes_atomic(folder / SIGNATURE_NAME, bundle.read_bytes())
    info = read_signature(folder)
    log.info("signed %s: %d files, %s", folder, len(info.files), info.signer)
    return info


def verify_export(directory: str | os.PathLike[str], public_key: str | os.PathLike[str]) -> SignatureInfo:
    """Check that ``model.sig`` in the export folder ``directory`` was made by ``public_key``'s private half and
    that every file it covers is there, unchanged. SignatureError (exit 2), one line naming the file, otherwise."""
    folder = Path(directory).expanduser().resolve()
    key_path = Path(public_key).expanduser()
    key = load_public_key(key_path)
    sig = folder / SIGNATURE_NAME
    if not sig.is_file():
        raise SignatureError(
            f"{sig} not found: the export {folder} is unsigned, and a signature by {key_path} is asked for "
            f"(runtime.verify / --verify-key); sign it: vitdeploy sign {folder} --key PRIVATE.pem"
        )
    data = _bundle_bytes(sig)  # read once: the bytes verified are the bytes whose digests are used after
    claimed = _parse_bundle(data, sig)
    before = {name: file_state(folder / name) for name in claimed.files}
    with tempfile.TemporaryDirectory(prefix="vitdeploy-verify-") as tmp:
        (Path(tmp) / SIGNATURE_NAME).write_bytes(data)
        _library_verify(folder, Path(tmp) / SIGNATURE_NAME, sig, key_path)
    if MANIFEST_NAME not in claimed.files:  # the manifest ties every artifact's sha256 to the signature
        raise SignatureError(f"{sig} does not cover {folder / MANIFEST_NAME}; re-sign the export: vitdeploy sign")
    steady = {n: s for n, s in before.items() if s is not None and file_state(folder / n) == s}
    log.info("%s: signature verified (%s, %d files)", folder, claimed.signer, len(claimed.files))
    states = steady if claimed.algorithm == HASH else {}
    return dataclasses.replace(claimed, verified_with=fingerprint(key), states=states)


def _library_verify(folder: Path, bundle: Path, sig: Path, key_path: Path) -> None:
    """model-signing's check of ``bundle`` over ``folder`` (only the files it covers); SignatureError naming
    the file otherwise (``sig``: the name the user knows)."""
    ms = require("model_signing", "verifying an export's signature")
    config = ms.verifying.Config().set_ignore_unsigned_files(True).use_elliptic_key_verifier(public_key=key_path)
    said = io.StringIO()  # the library prints a warning for old bundles: stdout is `predict --json`'s
    try:
        with contextlib.redirect_stdout(said):
            config.verify(folder, bundle)
    except Exception as exc:  # noqa: BLE001 - the library raises ValueError, InvalidSignature, parse errors
        raise _refusal(exc, folder, sig, key_path) from None
    finally:
        if said.getvalue().strip():
            log.warning("%s: %s", sig, first_line(said.getvalue(), 300))


def verify_uri(uri: str, public_key: str | os.PathLike[str]) -> SignatureInfo:
    """:func:`verify_export` for an export named by a URI (serve, batch-predict): a ``file://`` folder is checked
    where it lies; ConfigError for another scheme (the signature is checked on a folder on this machine)."""
    if uri.startswith("file://"):
        return verify_export(uri[len("file://") :], public_key)
    raise ConfigError(
        f"{clip(uri)}: runtime.verify / --verify-key checks an export folder on this machine; copy the export (with "
        f"its {SIGNATURE_NAME}) here and name the folder, or leave the check off for this URI"
    )


# the library's words for a changed and a missing file (its list of differences is a repr: quotes may be escaped)
_CHANGED = re.compile(r"Hash mismatch for \\?'(.+?)\\?':")
_MISSING = re.compile(r"Cannot use '(.+?)' ")


def _refusal(exc: Exception, folder: Path, sig: Path, key_path: Path) -> SignatureError:
    """The library's failure as one line naming the file (the refusal's why)."""
    text = str(exc)
    refused = "refusing the export"
    if text.startswith("Key mismatch"):
        try:
            signer = read_signature(folder).short_signer
        except SignatureError:
            signer = "an unreadable key hint"
        mine = fingerprint(load_public_key(key_path))[:23]
        return SignatureError(f"{sig}: signed by another key ({signer}), not by {key_path} ({mine}); {refused}")
    changed = _CHANGED.findall(text)
    if changed:
        more = f" (and {len(changed) - 1} more: {', '.join(changed[1:4])})" if len(changed) > 1 else ""
        return SignatureError(f"{folder / changed[0]}: changed since {sig} was signed{more}; {refused}")
    missing = _MISSING.findall(text)
    if missing:
        path = Path(missing[0])
        state = "is a link" if path.is_symlink() else "is missing"
        return SignatureError(f"{path}: {state}, and {sig} signed it as a file; {refused}")
    if type(exc).__name__ == "InvalidSignature":
        return SignatureError(f"{sig}: the signature does not verify with {key_path} (it was altered); {refused}")
    return SignatureError(
        f"{sig}: not a valid signature bundle ({first_line(exc, 300) or type(exc).__name__}); {refused}"
    )


def read_signature(directory: str | os.PathLike[str]) -> SignatureInfo:
    """What ``model.sig`` in ``directory`` claims, read without checking it (who, when, what): the report's.
    SignatureError when it is missing or unreadable."""
    sig = Path(directory) / SIGNATURE_NAME
    return _parse_bundle(_bundle_bytes(sig), sig)


def _bundle_bytes(sig: Path) -> bytes:
    return _read_small(
        sig,
        MAX_SIGNATURE_BYTES,
        SignatureError,
        str(sig),
        "not a signature bundle",
        "not found: the export is unsigned",
    )


def _parse_bundle(data: bytes, sig: Path) -> SignatureInfo:
    """What the bundle's bytes ``data`` (the file ``sig``) claim, unchecked."""
    try:
        bundle = json.loads(data)
        predicate = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))["predicate"]
        resources = predicate["resources"]
        serialization = predicate.get("serialization", {})
        material = bundle.get("verificationMaterial", {})
        digests = {str(r["name"]): str(r["digest"]).lower() for r in resources}
        mtime = sig.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureError(f"{sig}: not a signature bundle ({clip(first_line(exc, 200))})") from None
    hint = (material.get("publicKey") or {}).get("hint")
    signer = f"key sha256:{hint}" if hint else _certificate_signer(material)
    return SignatureInfo(
        path=str(sig),
        signer=signer,
        signed_at=datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc).isoformat(timespec="seconds"),
        algorithm=str(serialization.get("hash_type") or (resources[0].get("algorithm") if resources else "?")),
        files=tuple(sorted(digests)),
        ignored=tuple(sorted(str(p) for p in serialization.get("ignore_paths") or ())),
        digests=digests,
    )


def signature_status(directory: str | os.PathLike[str], public_key: str | os.PathLike[str] | None = None) -> Any:
    """The report's view of an export's signature: None when unsigned; else :meth:`SignatureInfo.to_dict` with
    ``verified`` (True, False, or None: no key to check it with here) and ``why`` (a refusal's line)."""
    if not (Path(directory) / SIGNATURE_NAME).exists():
        return None
    try:
        info = read_signature(directory)
    except SignatureError as exc:
        return {"path": str(Path(directory) / SIGNATURE_NAME), "verified": False, "why": first_line(exc)}
    if public_key is None:
        why = "not checked here: give the public key (report --verify-key, or runtime.verify)"
        return {**info.to_dict(), "verified": None, "why": why}
    try:
        checked = verify_export(directory, public_key)
    except (SignatureError, ConfigError) as exc:
        return {**info.to_dict(), "verified": False, "why": first_line(exc)}
    return {**checked.to_dict(), "verified": True, "why": f"verified with {public_key}"}


def _certificate_signer(material: dict[str, Any]) -> str:
    """``certificate <subject>`` (a Sigstore identity's e-mail or URI when it has one) of a bundle signed with a
    certificate; what the bundle holds is read, not checked."""
    from cryptography import x509

    chain = (material.get("x509CertificateChain") or {}).get("certificates") or [material.get("certificate") or {}]
    try:
        cert = x509.load_der_x509_certificate(base64.b64decode(chain[0]["rawBytes"]))
    except (KeyError, IndexError, TypeError, ValueError):
        return "unknown (the bundle names no key and no certificate)"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        identity = [
            str(v)
            for v in names.get_values_for_type(x509.RFC822Name)
            + names.get_values_for_type(x509.UniformResourceIdentifier)
        ]
    except x509.ExtensionNotFound:
        identity = []
    return f"certificate {clip(identity[0] if identity else cert.subject.rfc4514_string(), 200)}"


__all__ = [
    "HASH",
    "PASSWORD_ENV",
    "SignatureInfo",
    "UNSIGNED",
    "check_sign_key",
    "fingerprint",
    "load_private_key",
    "load_public_key",
    "read_signature",
    "sign_export",
    "signature_status",
    "verify_export",
    "verify_uri",
]
