"""A directory written by ``vitdeploy export``: its manifest, and its files checked before use.

Every file the runtime opens goes through :meth:`Artifacts.path`, which refuses paths that leave
the directory and verifies the file's size and sha256 (and those of its ONNX external data)
against the manifest, once per :class:`Artifacts` instance. Needs neither torch nor
onnxruntime; ``onnx`` only for :func:`check_onnx_external_data`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from ..errors import ArtifactError
from ..preprocess_spec import PreprocessSpec
from ..vocab import ARTIFACT_FILES, MANIFEST_NAME

log = logging.getLogger(__name__)

MANIFEST_FORMAT = "vitdeploy-manifest"
MANIFEST_VERSION = 1
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
    """``directory / relative`` resolved (symlinks followed); ArtifactError if it leaves ``directory``."""
    root = Path(directory).resolve()
    if not isinstance(relative, str) or not relative:
        raise ArtifactError(f"{what}: expected a relative file name, got {relative!r}")
    if os.path.isabs(relative) or Path(relative).is_absolute() or relative.startswith(("/", "\\")):
        raise ArtifactError(f"{what}: path {relative!r} is absolute; artifact paths must stay inside {root} "
                            f"(refusing it: a tampered manifest or model could point anywhere)")
    target = (root / relative).resolve()
    try:
        target.relative_to(root)
    except ValueError:
        raise ArtifactError(f"{what}: path {relative!r} resolves to {target}, outside the artifact directory "
                            f"{root} (via '..' or a symlink); refusing it") from None
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
    from .._deps import require

    onnx = require("onnx", "checking an ONNX model's external data")
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise ArtifactError(f"ONNX model {onnx_path} does not exist; {_FIX}")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types on corrupt input
        raise ArtifactError(f"cannot read ONNX model {onnx_path}: {exc}; {_FIX}") from exc
    files: dict[Path, None] = {}
    external = onnx.TensorProto.EXTERNAL
    for tensor in _iter_tensors(model.graph):
        if tensor.data_location != external:
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location")
        what = f"ONNX model {onnx_path}: tensor {tensor.name!r} external data"
        if not location:
            raise ArtifactError(f"{what} has no 'location'; the model is corrupt; {_FIX}")
        target = resolve_inside(onnx_path.parent, location, what)
        if not target.is_file():
            raise ArtifactError(f"{what} file {target} is missing; copy it next to {onnx_path.name} or {_FIX}")
        files[target] = None
    return list(files)


class Artifacts:
    """A loaded export directory: the manifest plus verified access to its files."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self._directory = directory
        self._manifest = manifest
        self._verified: set[str] = set()
        self._lock = threading.Lock()
        self._preprocess = self._parse_preprocess()
        self._input_shape = self._parse_input_shape()

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> "Artifacts":
        """Read ``directory/manifest.json``. ArtifactError when the directory or manifest is unusable."""
        if isinstance(directory, Artifacts):
            return directory
        path = Path(directory)
        if not path.exists():
            raise ArtifactError(f"artifact directory {path} does not exist; {_FIX} with --out {path}")
        if path.is_file() and path.name == MANIFEST_NAME:
            path = path.parent
        if not path.is_dir():
            raise ArtifactError(f"{path} is not a directory; pass the folder `vitdeploy export` wrote ({_FIX})")
        manifest_path = path / MANIFEST_NAME
        if not manifest_path.is_file():
            raise ArtifactError(f"{manifest_path} not found: {path} is not an export directory; {_FIX} with --out {path}")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"{manifest_path} is not valid JSON ({exc}); {_FIX}") from exc
        if not isinstance(manifest, dict):
            raise ArtifactError(f"{manifest_path}: expected a JSON object, got {type(manifest).__name__}; {_FIX}")
        fmt = manifest.get("format")
        if fmt != MANIFEST_FORMAT:
            raise ArtifactError(f"{manifest_path}: \"format\" is {fmt!r}, expected {MANIFEST_FORMAT!r}; "
                                f"this is not a vitdeploy manifest; {_FIX}")
        version = manifest.get("version")
        if not isinstance(version, int) or version < 1 or version > MANIFEST_VERSION:
            raise ArtifactError(f"{manifest_path}: manifest version {version!r} is not supported (this vitdeploy "
                                f"reads version {MANIFEST_VERSION}); upgrade vitdeploy or {_FIX}")
        for key, kind in (("io", dict), ("artifacts", dict), ("preprocess", dict)):
            if not isinstance(manifest.get(key), kind):
                raise ArtifactError(f"{manifest_path}: key {key!r} missing or not an object; {_FIX}")
        artifacts = cls(path, manifest)
        log.debug("opened artifacts %s (%s): roles %s", path, artifacts.name, sorted(manifest["artifacts"]))
        return artifacts

    def _where(self, key: str) -> str:
        return f"{self._directory / MANIFEST_NAME}: {key}"

    def _parse_preprocess(self) -> PreprocessSpec:
        try:
            return PreprocessSpec.from_dict(self._manifest["preprocess"])
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{self._where('preprocess')} is invalid: {exc}; {_FIX}") from exc

    def _parse_input_shape(self) -> tuple[int, int, int]:
        try:
            shape = self._manifest["io"]["input"]["shape"]
            chw = tuple(int(v) for v in shape[1:])
            if len(shape) != 4 or len(chw) != 3 or min(chw) <= 0:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            got = self._manifest.get("io", {}).get("input", {}) if isinstance(self._manifest.get("io"), dict) else None
            raise ArtifactError(f"{self._where('io.input.shape')} must be [\"batch\", C, H, W] with positive "
                                f"integers, got {got!r}; {_FIX}") from None
        return chw  # type: ignore[return-value]

    # ------------------------------------------------------------- properties

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    @property
    def name(self) -> str:
        return str(self._manifest.get("name") or self._directory.name)

    @property
    def labels(self) -> list[str]:
        return [str(v) for v in self._manifest.get("labels") or []]

    @property
    def preprocess(self) -> PreprocessSpec:
        return self._preprocess

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the model input."""
        return self._input_shape

    @property
    def io(self) -> dict[str, Any]:
        return self._manifest["io"]

    @property
    def input_name(self) -> str:
        return str(self.io.get("input", {}).get("name", "pixel_values"))

    @property
    def output_name(self) -> str:
        return str(self.io.get("output", {}).get("name", "logits"))

    @property
    def batch(self) -> dict[str, int]:
        """{"min", "opt", "max"}; defaults 1 / 8 / 32 for keys the manifest leaves out."""
        raw = self._manifest.get("batch")
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ArtifactError(f"{self._where('batch')} must be an object like {{\"min\": 1, \"opt\": 8, "
                                f"\"max\": 32}}, got {raw!r}; {_FIX}")
        out = {"min": 1, "opt": 8, "max": 32}
        for key in out:
            if key in raw:
                try:
                    out[key] = int(raw[key])
                except (TypeError, ValueError):
                    raise ArtifactError(f"{self._where('batch.' + key)} must be an integer, got {raw[key]!r}") from None
        if not 1 <= out["min"] <= out["opt"] <= out["max"]:
            raise ArtifactError(f"{self._where('batch')} must satisfy 1 <= min <= opt <= max, got {out}")
        return out

    @property
    def roles(self) -> list[str]:
        return sorted(self._manifest["artifacts"])

    def has(self, role: str) -> bool:
        return isinstance(self._manifest["artifacts"].get(role), dict)

    def entry(self, role: str) -> dict[str, Any]:
        entry = self._manifest["artifacts"].get(role)
        if not isinstance(entry, dict):
            raise ArtifactError(f"{self._where('artifacts')} has no {role!r} artifact (present: {self.roles or 'none'}); "
                                f"re-run `vitdeploy export` with that stage enabled")
        return entry

    # ------------------------------------------------------------- verification

    def path(self, role: str) -> Path:
        """The verified path of an artifact: inside the directory, right size, right sha256.

        Its ONNX external data files listed in the manifest are verified as well. Each role is
        hashed once per instance; later calls return the cached result.
        """
        entry = self.entry(role)
        target = resolve_inside(self._directory, entry.get("path"), f"artifact {role!r}")
        with self._lock:
            if role not in self._verified:
                self._verify_file(target, entry, f"artifact {role!r}")
                extra = entry.get("external_data") or []
                if not isinstance(extra, list):
                    raise ArtifactError(f"{self._where('artifacts.' + role + '.external_data')} must be a list")
                for i, sub in enumerate(extra):
                    if not isinstance(sub, dict):
                        raise ArtifactError(f"{self._where(f'artifacts.{role}.external_data[{i}]')} must be an object")
                    what = f"artifact {role!r} external data"
                    self._verify_file(resolve_inside(self._directory, sub.get("path"), what), sub, what)
                self._verified.add(role)
        return target

    def verify(self, roles: list[str] | None = None) -> dict[str, Path]:
        """Verify several roles (all present ones by default); ArtifactError on the first failure."""
        return {role: self.path(role) for role in (roles if roles is not None else self.roles)}

    def _verify_file(self, path: Path, entry: dict[str, Any], what: str) -> None:
        if not path.is_file():
            raise ArtifactError(f"{what}: file {path} is missing; {_FIX}")
        expected_hash = entry.get("sha256")
        if not isinstance(expected_hash, str) or len(expected_hash) != 64:
            raise ArtifactError(f"{what}: manifest entry for {path.name} has no valid sha256 ({expected_hash!r}); {_FIX}")
        expected_size = entry.get("bytes")
        if expected_size is not None and (isinstance(expected_size, bool) or not isinstance(expected_size, int)
                                          or expected_size < 0):
            raise ArtifactError(f"{what}: manifest entry for {path.name} has an invalid \"bytes\" "
                                f"{expected_size!r} (expected a non-negative integer); {_FIX}")
        actual_size = path.stat().st_size
        if expected_size is not None and expected_size != actual_size:
            raise ArtifactError(f"{what}: tampered or corrupt: {path} size expected {expected_size} bytes got "
                                f"{actual_size}; {_FIX}")
        actual_hash = sha256_file(path)
        if actual_hash != expected_hash.lower():
            raise ArtifactError(f"{what}: tampered or corrupt: {path} sha256 expected {expected_hash.lower()} got "
                                f"{actual_hash}; {_FIX}")
        log.debug("verified %s (%d bytes, sha256 %s)", path, actual_size, actual_hash[:12])

    def __repr__(self) -> str:
        return f"Artifacts({str(self._directory)!r}, name={self.name!r}, roles={self.roles})"
