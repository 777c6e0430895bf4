"""`vitdeploy sign`: an export folder signed (model.sig), or its signature checked; and the options that ask the
commands which load an export for a signature (``--verify-key``) or sign one (``export --sign-key``).

The command is registered by ``cli/__init__.py``, which wraps its callback in the one error handler.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..base.vocab import SIGNATURE_NAME

#: predict, serve, batch-predict, rollout, triton-repo: use the export only if this key signed it
verify_key_option = click.option(
    "--verify-key",
    "verify_key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"PEM public key: refuse the export (exit 2) unless its {SIGNATURE_NAME} is that key's and nothing it "
    "covers changed (default: runtime.verify.public_key; absent: no check)",
)

#: export: sign the export once written
sign_key_option = click.option(
    "--sign-key",
    "sign_key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"PEM elliptic-curve private key: sign the export once written ({SIGNATURE_NAME}; an encrypted key's "
    "password in $VITDEPLOY_SIGN_KEY_PASSWORD)",
)


@click.command("sign")
@click.argument("export_dir", metavar="EXPORT", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--key",
    "private_key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PEM elliptic-curve private key (P-256, P-384, P-521) that signs; an encrypted key's password in "
    "$VITDEPLOY_SIGN_KEY_PASSWORD",
)
@click.option(
    "--verify-key",
    "verify_key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"PEM public key: check that it signed EXPORT/{SIGNATURE_NAME} and nothing covered changed (exit 2 if not)",
)
@click.option("--json", "as_json", is_flag=True, help="print what the signature covers as JSON")
def sign(export_dir: Path, private_key: Path | None, verify_key: Path | None, as_json: bool) -> None:
    """Sign the export folder EXPORT (--key: writes EXPORT/model.sig over every file there but the reports and
    caches later commands write), or check its signature (--verify-key), or both."""
    from ..base.errors import ConfigError
    from ..runtime.signature import sign_export, verify_export

    if private_key is None and verify_key is None:
        raise ConfigError("give --key PRIVATE.pem to sign the export, or --verify-key PUBLIC.pem to check it")
    info = sign_export(export_dir, private_key) if private_key is not None else None
    info = verify_export(export_dir, verify_key) if verify_key is not None else info
    assert info is not None
    if as_json:
        click.echo(json.dumps(info.to_dict(), indent=2))
        return
    done = "signed" if private_key is not None else "signature of"
    click.echo(f"{done} {export_dir}: {len(info.files)} files, by {info.short_signer} -> {info.path}")
    if info.verified_with:
        click.echo(f"verified: {info.verified_with[:23]} signed it, and nothing it covers changed")
    else:
        click.echo(f"next: vitdeploy predict IMAGES -a {export_dir} --verify-key PUBLIC.pem (the key's public half)")
