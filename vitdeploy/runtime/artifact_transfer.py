"""Export folders that travel: packed on the driver, unpacked into a per-node cache, verified there.

One of four modules about an export folder, each one idea: ``manifest_schema`` (what a manifest may
say), ``manifest_checks`` (each file against it), ``artifacts`` (a folder on this machine, every file
verified before use) and this one (getting a folder to another node). It was ``artifact_bundle`` (the
old path still imports, deprecated).

A replica or a batch worker on another node cannot open the driver's local path. Either the folder
travels with the job (:func:`pack` -> a bundle of bytes the caller puts in Ray's object store ->
:func:`materialize` on the worker's node), or it is fetched from a URI (:func:`fetch_uri`:
``file://``, ``s3://``, ``gs://`` through pyarrow's filesystems). Both land in one cache folder per
node, keyed by the sha256 of the manifest's bytes, written under a temporary name and renamed when
complete; every file is then verified against the manifest by :meth:`Artifacts.open` before any
backend reads it. A worker on the driver's own machine needs no copy: :func:`open_in_place` opens the
folder where it lies, against the manifest the driver read. No Ray import here: the callers (serve,
batch) own the transport.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..base._deps import require
from ..base.errors import ArtifactError, ArtifactIntegrityError
from ..base.vocab import MANIFEST_NAME
from .artifacts import Artifacts, resolve_inside

log = logging.getLogger(__name__)

CACHE_ENV = "VITDEPLOY_ARTIFACT_CACHE"
_COMPLETE = ".complete"


def default_cache_root() -> Path:
    """``$VITDEPLOY_ARTIFACT_CACHE``, else ``~/.cache/vitdeploy/artifacts``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "vitdeploy" / "artifacts"


@dataclass(frozen=True)
class ArtifactBundle:
    """An export folder's manifest and the files of the roles a job needs, as bytes.

    ``key``: sha256 of the manifest's bytes (the cache folder's name); ``roles``: the roles whose
    files travel (all listed roles when the bundle was packed for backend "auto")."""

    key: str
    name: str
    roles: tuple[str, ...]
    files: dict[str, bytes] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(len(v) for v in self.files.values())


def _cache_key(manifest_bytes: bytes, roles: Iterable[str], listed: Iterable[str]) -> str:
    """The cache folder's name: the manifest's sha256, plus the roles when only some travel."""
    digest = hashlib.sha256(manifest_bytes)
    chosen = sorted(set(roles))
    if chosen != sorted(set(listed)):
        digest.update(("\nroles:" + ",".join(chosen)).encode())
    return digest.hexdigest()


def _role_files(artifacts: Artifacts, roles: Iterable[str]) -> list[str]:
    """Relative paths of the files of ``roles`` (each role's file and its listed external data)."""
    out: list[str] = []
    for role in roles:
        entry = artifacts.entry(role)
        out.append(entry["path"])
        out.extend(sub["path"] for sub in entry.get("external_data") or [])
    return out


def pack(directory: str | os.PathLike[str] | Artifacts, roles: Iterable[str] | None = None) -> ArtifactBundle:
    """Verify ``directory`` (every listed file's size and sha256) and pack the manifest plus the files
    of ``roles`` (default: every listed role). ArtifactError naming the role when one is not listed."""
    artifacts = Artifacts.open(directory)
    chosen = tuple(artifacts.roles if roles is None else dict.fromkeys(roles))
    for role in chosen:
        artifacts.entry(role)  # raises, naming the roles present
    manifest_bytes = artifacts.manifest_path.read_bytes()
    files = {MANIFEST_NAME: manifest_bytes}
    for rel in _role_files(artifacts, chosen):
        files[rel] = resolve_inside(artifacts.directory, rel, "artifact").read_bytes()
    bundle = ArtifactBundle(_cache_key(manifest_bytes, chosen, artifacts.roles), artifacts.name, chosen, files)
    log.info(
        "packed %s: %d files, %.1f MB (roles %s)",
        artifacts.directory,
        len(files),
        bundle.nbytes / 1e6,
        ", ".join(chosen),
    )
    return bundle


def _publish(tmp: Path, final: Path) -> Path:
    """Mark ``tmp`` complete and rename it to ``final``; a concurrent winner's copy is kept."""
    (tmp / _COMPLETE).touch()
    try:
        os.replace(tmp, final)  # atomic on one filesystem; fails when ``final`` exists and is not empty
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / _COMPLETE).is_file():
            raise
    return final


def _cached(root: Path, key: str) -> Path | None:
    final = root / key
    return final if (final / _COMPLETE).is_file() else None


def _staging(root: Path, key: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=root))


def open_cached(path: Path, roles: Iterable[str]) -> Artifacts:
    """A folder (a node's cached copy, or the export itself opened in place) as verified Artifacts restricted
    to ``roles`` (every file's sha256 checked)."""
    artifacts = Artifacts.open(path, verify=False).restricted(roles)
    artifacts.verify_all()
    return artifacts


def open_in_place(directory: str | os.PathLike[str], manifest_sha256: str, roles: Iterable[str]) -> Artifacts:
    """The export folder a job's driver verified, opened where it lies by a worker on the same machine (no copy):
    the manifest must still be the one the driver read (its sha256), and the files of ``roles`` are verified
    again against it before any backend reads them."""
    folder = Path(directory)
    try:
        manifest_bytes = (folder / MANIFEST_NAME).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read {folder / MANIFEST_NAME}: {exc.strerror or exc}") from None
    if hashlib.sha256(manifest_bytes).hexdigest() != manifest_sha256:
        raise ArtifactIntegrityError(
            f"{folder / MANIFEST_NAME} changed while the job ran (its sha256 is not the one the job started with); "
            "run the job again on a folder nothing rewrites meanwhile"
        )
    return open_cached(folder, roles)


def materialize(bundle: ArtifactBundle, cache_root: str | os.PathLike[str] | None = None) -> Artifacts:
    """Write ``bundle`` into ``cache_root/<key>`` once per node and open it, verified.

    Every file's sha256 is checked against the manifest on open, whether written now or earlier."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    final = _cached(root, bundle.key)
    if final is None:
        tmp = _staging(root, bundle.key)
        try:
            for rel, data in bundle.files.items():
                target = resolve_inside(tmp, rel, f"bundle of {bundle.name}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            final = _publish(tmp, root / bundle.key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("unpacked %s into %s", bundle.name, final)
    return open_cached(final, bundle.roles)


def fetch_uri(
    uri: str,
    roles: Iterable[str] | Callable[[Artifacts], Iterable[str] | None] | None = None,
    cache_root: str | os.PathLike[str] | None = None,
) -> Artifacts:
    """Download the export folder at ``uri`` (``file://``, ``s3://``, ``gs://``, a local path) into the
    node's cache, once per manifest, and open it verified. ``roles``: the roles to fetch (default all), or a
    function of the listed manifest giving them (``partial(shipped_roles, backend)``: optional roles too)."""
    import json

    fs_mod = require("pyarrow.fs", f"reading artifacts from {uri}")
    try:
        fs, base = (
            fs_mod.FileSystem.from_uri(uri) if "://" in uri else (fs_mod.LocalFileSystem(), str(Path(uri).resolve()))
        )
        with fs.open_input_stream(f"{base.rstrip('/')}/{MANIFEST_NAME}") as fh:
            manifest_bytes = fh.read()
    except (OSError, ValueError) as exc:
        raise ArtifactError(
            f"cannot read {uri.rstrip('/')}/{MANIFEST_NAME}: {str(exc).splitlines()[0]}; "
            "check the URI and the credentials of this node"
        ) from None
    try:
        data = json.loads(manifest_bytes)
    except ValueError as exc:
        raise ArtifactError(f"{uri.rstrip('/')}/{MANIFEST_NAME} is not valid JSON ({exc})") from None
    listed = Artifacts(Path(base), data)  # the schema, checked before any download
    if callable(roles):
        roles = roles(listed)
    chosen = tuple(listed.roles if roles is None else dict.fromkeys(roles))
    for role in chosen:
        listed.entry(role)  # raises, naming the roles present
    key = _cache_key(manifest_bytes, chosen, listed.roles)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    final = _cached(root, key)
    if final is None:
        tmp = _staging(root, key)
        try:
            (tmp / MANIFEST_NAME).write_bytes(manifest_bytes)
            for rel in _role_files(listed, chosen):
                target = resolve_inside(tmp, rel, f"artifact at {uri}")
                target.parent.mkdir(parents=True, exist_ok=True)
                with fs.open_input_stream(f"{base.rstrip('/')}/{rel}") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            final = _publish(tmp, root / key)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ArtifactError(f"cannot download the artifacts at {uri}: {str(exc).splitlines()[0]}") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("downloaded %s into %s", uri, final)
    return open_cached(final, chosen)


__all__ = ["ArtifactBundle", "CACHE_ENV", "default_cache_root", "fetch_uri", "materialize", "open_cached", "pack"]
