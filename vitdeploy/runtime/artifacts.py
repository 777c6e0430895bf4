"""A directory written by ``vitdeploy export``: its manifest, and its files checked before use.

One of four modules about an export folder: ``manifest_schema`` (what a manifest may say),
``manifest_checks`` (each file against it), this one (a folder on this machine, verified) and
``artifact_transfer`` (getting a folder to another node).

Every file the runtime opens goes through :meth:`Artifacts.path`, which refuses paths that leave
the directory and verifies the file's size and sha256 (and those of its ONNX external data)
against the manifest, once per :class:`Artifacts` instance. Needs neither torch nor
onnxruntime; ``onnx`` only for :func:`check_onnx_external_data`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from ..base._files import file_state
from ..base.errors import ArtifactError, ArtifactIntegrityError, InputError
from ..base.limits import clip_text
from ..base.preprocess_spec import PreprocessSpec
from ..base.vocab import ARTIFACT_FILES, MANIFEST_NAME
from .manifest_checks import check_engine_meta, check_model_config
from .manifest_schema import (
    MANIFEST_FORMAT,  # noqa: F401
    MANIFEST_VERSION,  # noqa: F401
    Manifest,
    parse_manifest,
    read_json_bounded,
)

log = logging.getLogger(__name__)

ROLES = tuple(ARTIFACT_FILES)
_CHUNK = 1 << 20  # 1 MiB
_FIX = "run `vitdeploy export` to (re)create the artifacts"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (constant memory for multi-GB engines)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_inside(directory: str | os.PathLike[str], relative: str, what: str) -> Path:
    """``directory / relative`` resolved (symlinks followed); ArtifactIntegrityError if it leaves ``directory``."""
    root = Path(directory).resolve()
    if not isinstance(relative, str) or not relative:
        raise ArtifactIntegrityError(f"{what}: expected a relative file name, got {relative!r}")
    if os.path.isabs(relative) or Path(relative).is_absolute() or relative.startswith(("/", "\\")):
        raise ArtifactIntegrityError(
            f"{what}: path {relative!r} is absolute; artifact paths must stay inside {root} "
            f"(refusing it: a tampered manifest or model could point anywhere)"
        )
    target = (root / relative).resolve()
    try:
        target.relative_to(root)
    except ValueError:
        raise ArtifactIntegrityError(
            f"{what}: path {relative!r} resolves to {target}, outside the artifact directory "
            f"{root} (via '..' or a symlink); refusing it"
        ) from None
    return target


def _iter_tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto a graph can carry data in, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _iter_tensors(attr.g)
            for sub in attr.graphs:
                yield from _iter_tensors(sub)


def check_onnx_external_data(onnx_path: str | os.PathLike[str]) -> list[Path]:
    """Refuse an ONNX model whose external data lies outside the model's directory.

    Loads the graph only (``load_external_data=False``) and checks every tensor stored externally:
    its ``location`` must be a relative path that resolves (symlinks followed) inside the folder of
    ``onnx_path``. Returns the distinct external files, resolved. ArtifactError otherwise: a model
    naming ``../../etc/shadow`` or ``/dev/zero`` as its weights must never be opened.
    """
    from ..base._deps import require
    from ..base.onnx_wire import light_model

    onnx = require("onnx", "checking an ONNX model's external data")
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise ArtifactError(f"ONNX model {onnx_path} does not exist; {_FIX}")
    try:
        model = light_model(onnx_path)  # the weights' values are never read
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types on corrupt input
        raise ArtifactIntegrityError(
            f"cannot read ONNX model {onnx_path}: {clip_text(str(exc))}; the file is not a valid ONNX graph; {_FIX}"
        ) from exc
    files: dict[Path, None] = {}
    external = onnx.TensorProto.EXTERNAL
    for tensor in _iter_tensors(model.graph):
        if tensor.data_location != external:
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location")
        what = f"ONNX model {onnx_path}: tensor {tensor.name!r} external data"
        if not location:
            raise ArtifactIntegrityError(f"{what} has no 'location'; the model is corrupt; {_FIX}")
        target = resolve_inside(onnx_path.parent, location, what)
        if not target.is_file():
            raise ArtifactIntegrityError(
                f"{what} file {target} is missing; copy it next to {onnx_path.name} or {_FIX}"
            )
        files[target] = None
    return list(files)


class Artifacts:
    """A loaded export directory: the validated manifest plus verified access to its files.

    :meth:`open` is the one way in, for the Predictor, bench, drift and any later caller (serving):
    the manifest is validated against its schema, then (``verify=True``, the default) every
    listed artifact is checked for size and sha256 and the small metadata files (model.json,
    model.engine.json) against the manifest, before any backend reads anything. One failing
    file refuses the whole directory (ArtifactIntegrityError, exit 2), whatever the backend.
    """

    def __init__(self, directory: Path, manifest: dict[str, Any], schema: Manifest | None = None) -> None:
        self._directory = directory
        self._manifest = manifest
        self._schema = schema if schema is not None else parse_manifest(manifest, directory / MANIFEST_NAME)
        self._verified: set[str] = set()
        self._onnx_checked: set[str] = set()
        self._lock = threading.Lock()
        self._preprocess = self._schema.preprocess  # a PreprocessSpec, read strictly by parse_manifest
        self._manifest_sha256: str | None = None
        #: path -> (sha256, file_state) of the files a verified signature (model.sig) hashed just before
        self._vouched: dict[Path, tuple[str, tuple[int, ...]]] = {}

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        verify: bool = True,
        public_key: str | os.PathLike[str] | None = None,
    ) -> "Artifacts":
        """Read and validate ``directory/manifest.json``; with ``verify`` check every listed file.

        ArtifactError (exit 2) when the directory or manifest is unusable; ArtifactIntegrityError
        when a listed file is missing, tampered with or contradicts the manifest. ``public_key``
        (runtime.verify, ``--verify-key``): first the folder's signature (runtime/signature.py), before
        a byte of the manifest is read; SignatureError when it is unsigned, signed by another key or changed."""
        if isinstance(directory, Artifacts):
            if public_key is not None:
                from .signature import verify_export

                directory._vouch(verify_export(directory.directory, public_key))
            if verify:
                directory.verify_all()
            return directory
        path = Path(directory)
        if not path.exists():
            raise ArtifactError(f"artifact directory {path} does not exist; {_FIX} with --out {path}")
        if path.is_file() and path.name == MANIFEST_NAME:
            path = path.parent
        if not path.is_dir():
            raise ArtifactError(f"{path} is not a directory; pass the folder `vitdeploy export` wrote ({_FIX})")
        manifest_path = path / MANIFEST_NAME
        if not os.access(path, os.R_OK | os.X_OK):
            raise ArtifactError(
                f"{path}: cannot read the artifact directory (permission denied); make it readable "
                f"by this user (e.g. chmod a+rx)"
            )
        signature = None
        if public_key is not None:
            from .signature import verify_export

            signature = verify_export(path, public_key)
        if not manifest_path.is_file():
            raise ArtifactError(
                f"{manifest_path} not found: {path} is not an export directory; {_FIX} with --out {path}"
            )
        data = read_json_bounded(manifest_path, "manifest")
        artifacts = cls(path, data, parse_manifest(data, manifest_path))
        if signature is not None:
            artifacts._vouch(signature)
        if verify:
            artifacts.verify_all()
        log.debug("opened artifacts %s (%s): roles %s", path, artifacts.name, artifacts.roles)
        return artifacts

    @property
    def manifest_path(self) -> Path:
        return self._directory / MANIFEST_NAME

    @property
    def manifest_sha256(self) -> str:
        """The sha256 of ``manifest.json``'s bytes: which export this is. The manifest lists every file's sha256,
        so two folders with the same manifest hold the same export; a copy that travelled to another node (its
        bytes copied as they are) keeps it. What a server reports as the export it runs (`validate --url`)."""
        if self._manifest_sha256 is None:
            try:
                self._manifest_sha256 = sha256_file(self.manifest_path)
            except OSError as exc:
                raise ArtifactError(f"cannot read {self.manifest_path}: {exc.strerror or exc}") from None
        return self._manifest_sha256

    def _where(self, key: str) -> str:
        return f"{self.manifest_path}: {key}"

    # ------------------------------------------------------------- properties

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest as read (a dict); :attr:`schema` is the validated form."""
        return self._manifest

    @property
    def schema(self) -> Manifest:
        return self._schema

    @property
    def name(self) -> str:
        return str(self._schema.name or self._directory.name)

    @property
    def labels(self) -> list[str]:
        return list(self._schema.labels)

    @property
    def preprocess(self) -> PreprocessSpec:
        return self._preprocess

    @property
    def image_sizes(self) -> tuple[int, ...]:
        """The square sides an export for several sizes answers at; () for a fixed-size export."""
        return self._schema.sizes

    def preprocess_at(self, size: int | None) -> PreprocessSpec:
        """The preprocessing for a square input of ``size`` (None: the base size); InputError naming the sizes
        that work for any other."""
        base = self.input_shape[1]
        if size is None or size == base:
            return self._preprocess
        if size in self.image_sizes:
            return self._schema.image_sizes.preprocess[str(size)]
        works = ", ".join(map(str, self.image_sizes or (base,)))
        raise InputError(f"image size {size} is not one this export answers at; sizes that work: {works}")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the model input."""
        return self._schema.chw

    @property
    def io(self) -> dict[str, Any]:
        return self._schema.io.model_dump(exclude_none=True)

    @property
    def input_name(self) -> str:
        return self._schema.io.input.name

    @property
    def output_name(self) -> str:
        return self._schema.io.output.name

    @property
    def batch(self) -> dict[str, int]:
        """{"min", "opt", "max"}; defaults 1 / 8 / 32 for keys the manifest leaves out."""
        return self._schema.batch.model_dump()

    @property
    def roles(self) -> list[str]:
        return sorted(self._schema.artifacts)

    def restricted(self, roles: Any) -> "Artifacts":
        """The same directory seen through the listed ``roles`` only (a folder that travelled with
        only the files one backend reads). The manifest is unchanged; the other roles are absent."""
        keep = {role: self._schema.artifacts[role] for role in dict.fromkeys(roles) if role in self._schema.artifacts}
        if not keep:
            raise ArtifactError(
                f"{self._where('artifacts')} lists none of the roles {list(roles)} (present: {self.roles or 'none'})"
            )
        view = Artifacts(self._directory, self._manifest, self._schema.model_copy(update={"artifacts": keep}))
        view._manifest_sha256 = self._manifest_sha256
        view._vouched = self._vouched
        return view

    def has(self, role: str) -> bool:
        return role in self._schema.artifacts

    def entry(self, role: str) -> dict[str, Any]:
        entry = self._schema.artifacts.get(role)
        if entry is None:
            raise ArtifactError(
                f"{self._where('artifacts')} has no {role!r} artifact (present: {self.roles or 'none'}); "
                f"re-run `vitdeploy export` with that stage enabled"
            )
        return entry.model_dump()

    # ------------------------------------------------------------- verification

    def path(self, role: str) -> Path:
        """The verified path of an artifact: inside the directory, right size, right sha256.

        Its ONNX external data files listed in the manifest are verified as well. Each role is
        hashed once per instance; later calls return the cached result.
        """
        entry = self._schema.artifacts.get(role)
        if entry is None:
            self.entry(role)  # raises, naming the roles present
        assert entry is not None
        target = resolve_inside(self._directory, entry.path, f"artifact {role!r}")
        with self._lock:
            if role not in self._verified:
                self._verify_file(target, entry, f"artifact {role!r}")
                for sub in entry.external_data:
                    what = f"artifact {role!r} external data"
                    self._verify_file(resolve_inside(self._directory, sub.path, what), sub, what)
                self._verified.add(role)
        return target

    def onnx_path(self, role: str) -> Path:
        """The verified ONNX graph of ``role``, refused (ArtifactIntegrityError) unless every external
        data file it loads lies inside the directory and is listed (so sha256-verified) in the manifest."""
        path = self.path(role)  # verifies the graph and the external data the manifest lists
        if role in self._onnx_checked:
            return path
        listed = {
            resolve_inside(self._directory, sub["path"], f"artifact {role!r} external data")
            for sub in self.entry(role).get("external_data") or []
        }
        unlisted = [p for p in check_onnx_external_data(path) if p not in listed]
        if unlisted:
            names = ", ".join(str(p.relative_to(self._directory.resolve())) for p in unlisted)
            raise ArtifactIntegrityError(
                f"artifact {role!r}: {path.name} loads external data {names} that "
                f"{MANIFEST_NAME} does not list under artifacts.{role}.external_data, so its "
                f"sha256 cannot be checked; refusing it; {_FIX}"
            )
        self._onnx_checked.add(role)
        return path

    def verify(self, roles: list[str] | None = None) -> dict[str, Path]:
        """Verify several roles (all present ones by default); ArtifactError on the first failure."""
        return {role: self.path(role) for role in (roles if roles is not None else self.roles)}

    def verify_all(self) -> dict[str, Path]:
        """Every listed artifact's size and sha256, every ONNX graph's external data (inside the folder
        and listed, whichever backend will run), then the metadata files against the manifest."""
        paths = self.verify()
        for role, path in paths.items():
            if path.suffix == ".onnx":
                self.onnx_path(role)
        if "weights-config" in paths:
            cfg_path = paths["weights-config"]
            check_model_config(self._schema, read_json_bounded(cfg_path, "model config"), cfg_path, self.manifest_path)
        for role in ("engine-meta", "engine-int8-meta"):
            if role in paths:
                meta_path = paths[role]
                check_engine_meta(
                    self._schema, read_json_bounded(meta_path, "engine description"), meta_path, self.manifest_path
                )
        return paths

    def _vouch(self, signature: Any) -> None:
        """Take the sha256 a verified signature (runtime/signature.py) just computed for each file it covers as
        this folder's, for as long as the file's state stays what it was then: one hashing pass, not two."""
        root = self._directory.resolve()
        for name, state in signature.states.items():
            self._vouched[root / name] = (signature.digests[name], state)

    def _verify_file(self, path: Path, entry: Any, what: str) -> None:
        vouched = self._vouched.get(path)
        if vouched is not None and vouched[0] == entry.sha256 and vouched[1][2] == entry.bytes:
            if file_state(path) == vouched[1]:
                log.debug("verified %s: its sha256 as the signature checked it (unchanged since)", path)
                return
        try:
            actual_size = path.stat().st_size
        except FileNotFoundError:
            raise ArtifactIntegrityError(f"{what}: file {path} is missing; {_FIX}") from None
        except OSError as exc:
            raise ArtifactError(f"{what}: cannot read {path} ({exc.strerror or exc}); {_FIX}") from None
        if not path.is_file():
            raise ArtifactIntegrityError(f"{what}: {path} is not a regular file; {_FIX}")
        if entry.bytes != actual_size:
            raise ArtifactIntegrityError(
                f"{what}: tampered or corrupt: {path} size expected {entry.bytes} bytes got "
                f"{actual_size}; the whole directory is refused; {_FIX}"
            )
        try:
            actual_hash = sha256_file(path)
        except PermissionError as exc:
            raise ArtifactError(
                f"{what}: cannot read {path} ({exc.strerror}); make it readable by this user "
                f"(e.g. chmod a+r {path.name})"
            ) from None
        except OSError as exc:
            raise ArtifactError(f"{what}: cannot read {path} ({exc.strerror or exc}); {_FIX}") from None
        if actual_hash != entry.sha256:
            raise ArtifactIntegrityError(
                f"{what}: tampered or corrupt: {path} sha256 expected {entry.sha256} got "
                f"{actual_hash}; the whole directory is refused; {_FIX}"
            )
        log.debug("verified %s (%d bytes, sha256 %s)", path, actual_size, actual_hash[:12])

    def __repr__(self) -> str:
        return f"Artifacts({str(self._directory)!r}, name={self.name!r}, roles={self.roles})"
