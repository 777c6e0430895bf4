"""The schema of ``manifest.json`` and the checks that tie each artifact to it.

One of four modules about an export folder: this one (what a manifest may say), ``manifest_checks`` (each
file against it), ``artifacts`` (a folder on this machine, verified) and ``artifact_transfer`` (getting a
folder to another node).

A manifest is input like any other: a tampered or hand-edited one must be refused before any
backend reads a byte it names. :func:`parse_manifest` validates it (pydantic, frozen): the
sections the runtime trusts (``artifacts``, ``io``, ``batch``, ``preprocess``, ``labels``) refuse
unknown keys and impossible values, and must agree with each other (one label per output class,
the preprocessing size is the input size). Informational sections (``model``, ``versions``,
``validation``, ``stages``, ``export``, ...) are only type-checked, and top-level keys this
version does not know are kept but never trusted, so a manifest written by a later vitdeploy
with an extra section still opens.

The checks of the files themselves against the manifest are ``manifest_checks.py``'s.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator, model_validator

from ..base._schema import NonNegativeInt, StrictSection, format_validation_error
from ..base.errors import ArtifactError
from ..base.limits import MAX_BATCH, MAX_JSON_BYTES, clip
from ..base.output_spec import ModelOutput
from ..base.preprocess_spec import MAX_IMAGE_SIDE, PreprocessSpec

MANIFEST_FORMAT = "vitdeploy-manifest"
MANIFEST_VERSION = 1
FIX = "run `vitdeploy export` to (re)create the artifacts"

_ROLE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
DTYPES = ("float32", "float16")


def _relative_path(value: Any) -> str:
    """A path inside the artifact directory: relative, no '..', no backslash, no NUL."""
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty relative file name")
    if len(value) > 1024 or "\x00" in value or "\\" in value:
        raise ValueError("must be a plain relative file name (no NUL or backslash, at most 1024 characters)")
    if PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute() or PureWindowsPath(value).drive:
        raise ValueError("is absolute; artifact paths must stay inside the artifact directory")
    if any(part in ("..", ".", "") for part in value.split("/")):
        raise ValueError(
            "must not contain '..', '.' or empty components; artifact paths must stay inside the directory"
        )
    return value


RelPath = Annotated[str, Field(description="relative to the artifact directory")]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH)]


class ExternalFile(StrictSection):
    path: RelPath
    sha256: StrictStr
    bytes: NonNegativeInt

    @field_validator("path", mode="before")
    @classmethod
    def _path(cls, v: Any) -> str:
        return _relative_path(v)

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not _SHA256.match(v):
            raise ValueError("must be 64 hexadecimal digits (a sha256)")
        return v.lower()


class FileEntry(ExternalFile):
    external_data: tuple[ExternalFile, ...] = ()


class HubRecord(StrictSection):
    """``model.source.hub``: where a checkpoint named on the Hugging Face Hub came from (informational, typed):
    the repo, the revision asked for (None: the default branch), the commit it resolved to, each file's sha256."""

    source: Literal["hub"]
    endpoint: StrictStr
    repo_id: StrictStr = Field(min_length=3, max_length=96)
    revision: Optional[StrictStr] = None
    commit: StrictStr = Field(pattern=r"^[0-9a-f]{40}$")
    files: tuple[ExternalFile, ...] = Field(min_length=1)
    client: StrictStr = ""
    offline: bool = False


class TensorSpec(StrictSection):
    name: StrictStr = Field(min_length=1, max_length=256)
    dtype: Literal["float32", "float16"] = "float32"
    shape: tuple[Any, ...]

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        if not v:
            raise ValueError("must list the dimensions")
        first, rest = v[0], v[1:]
        if not (isinstance(first, str) and first) and not (type(first) is int and first >= 1):
            raise ValueError('the first dimension must be the batch: a name like "batch" (or a positive integer)')
        if any(type(d) is not int or d < 1 for d in rest):
            raise ValueError("dimensions after the batch must be positive integers")
        return v


class IOSpec(StrictSection):
    input: TensorSpec
    output: TensorSpec
    features: Optional[TensorSpec] = None
    #: an embedding export's patch tokens ([batch, patches, width]; output.patch_tokens), absent otherwise
    patch_tokens: Optional[TensorSpec] = None

    @model_validator(mode="after")
    def _ranks(self) -> "IOSpec":
        if len(self.input.shape) != 4:
            raise ValueError(f'io.input.shape must be ["batch", C, H, W], got {clip(list(self.input.shape))}')
        if self.input.shape[1] != 3:
            raise ValueError(f"io.input.shape has {self.input.shape[1]} channels; the preprocessing produces RGB (3)")
        if any(s > MAX_IMAGE_SIDE for s in self.input.shape[2:]):
            raise ValueError(
                f"io.input.shape {clip(list(self.input.shape))} is larger than {MAX_IMAGE_SIDE} px a side"
            )
        if len(self.output.shape) != 2:
            raise ValueError(f'io.output.shape must be ["batch", classes], got {clip(list(self.output.shape))}')
        if self.patch_tokens is not None and len(self.patch_tokens.shape) != 3:
            shape = clip(list(self.patch_tokens.shape))
            raise ValueError(f'io.patch_tokens.shape must be ["batch", patches, width], got {shape}')
        extra = [t.name for t in (self.features, self.patch_tokens) if t is not None]
        names = [self.input.name, self.output.name, *extra]
        if len(set(names)) != len(names):
            raise ValueError(f"io tensor names must differ, got {clip(names)}")
        return self


class ImageSizes(StrictSection):
    """An export for several sizes (export.image_sizes): the square sides its graphs answer at (io.input's
    is the base) and the preprocessing of each, keyed by the side ("336")."""

    sizes: tuple[Annotated[int, Field(gt=0, le=MAX_IMAGE_SIDE)], ...] = Field(min_length=1, max_length=32)
    preprocess: dict[str, PreprocessSpec]

    @model_validator(mode="after")
    def _one_recipe_each(self) -> "ImageSizes":
        if sorted(self.preprocess) != sorted(str(s) for s in self.sizes):
            raise ValueError(f"image_sizes.preprocess names {clip(sorted(self.preprocess))}, not the sizes")
        for side, spec in self.preprocess.items():
            if (spec.height, spec.width) != (int(side), int(side)):
                raise ValueError(f"image_sizes.preprocess[{side!r}] is {spec.height}x{spec.width}")
        return self


class BatchSpec(StrictSection):
    min: BatchSize = 1
    opt: BatchSize = 8
    max: BatchSize = 32

    @field_validator("min", "opt", "max", mode="before")
    @classmethod
    def _int(cls, v: Any) -> Any:
        if type(v) is not int:
            raise ValueError("must be an integer")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> "BatchSpec":
        if not self.min <= self.opt <= self.max:
            raise ValueError(
                f"batch sizes must satisfy 1 <= min <= opt <= max, got min={self.min}, opt={self.opt}, max={self.max}"
            )
        return self


#: Deprecated alias (one release): the manifest's "preprocess" is read straight into the one definition.
PreprocessSection = PreprocessSpec


Label = Annotated[StrictStr, Field(max_length=1024)]


class Manifest(BaseModel):
    """manifest.json, validated. Unknown top-level keys are kept (forward compatible), never used."""

    model_config = ConfigDict(extra="allow", frozen=True)

    format: Literal["vitdeploy-manifest"]
    version: Annotated[int, Field(ge=1, le=MANIFEST_VERSION)]
    name: Optional[Annotated[StrictStr, Field(max_length=256)]] = None
    labels: tuple[Label, ...]  # one per output class; [] for an embedding model
    output: ModelOutput = ModelOutput()  # absent: a classifier (every export before embeddings)
    preprocess: PreprocessSpec  # strict types and the same checks as in Python (preprocess_spec.py)
    io: IOSpec
    batch: BatchSpec = BatchSpec()
    artifacts: dict[str, FileEntry]
    # Informational: written by the exporter, read by people and reports, never by the runtime.
    created: Optional[StrictStr] = None
    model: Optional[dict[str, Any]] = None
    versions: Optional[dict[str, Optional[StrictStr]]] = None
    validation: Optional[dict[str, Any]] = None
    stages: Optional[list[dict[str, Any]]] = None
    export: Optional[dict[str, Any]] = None
    validation_inputs: Optional[dict[str, Any]] = None
    preprocess_origins: Optional[dict[str, StrictStr]] = None  # where each preprocessing value came from
    image_sizes: Optional[ImageSizes] = None  # absent: one fixed size (io.input.shape)
    # which library's preprocessing it mirrors: {"library", "version", "processor" | "transform", ...}
    preprocess_reference: Optional[dict[str, Any]] = None

    @field_validator("model")
    @classmethod
    def _hub(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        source = (v or {}).get("source")
        if isinstance(source, dict) and source.get("hub") is not None:
            HubRecord.model_validate(source["hub"])  # typed where present: `info -a` reads it
        return v

    @property
    def hub(self) -> Optional[HubRecord]:
        """The Hub provenance of the checkpoint, when it was named on the Hub."""
        source = (self.model or {}).get("source")
        hub = source.get("hub") if isinstance(source, dict) else None
        return HubRecord.model_validate(hub) if hub is not None else None

    @field_validator("artifacts")
    @classmethod
    def _roles(cls, v: dict[str, FileEntry]) -> dict[str, FileEntry]:
        if not v:
            raise ValueError("lists no artifact; an export always lists at least model.onnx")
        for role in v:
            if not _ROLE.match(role):
                raise ValueError(f"artifact role {clip(role)} is not a role name (lower-case letters, digits, '-')")
        paths = [e.path for e in v.values()] + [x.path for e in v.values() for x in e.external_data]
        if len(set(paths)) != len(paths):
            raise ValueError("two artifacts name the same file")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Manifest":
        width = self.io.output.shape[1]
        if self.output.is_embedding:
            if self.labels:
                raise ValueError(
                    f"labels has {len(self.labels)} entries but output.kind is embedding; an embedding has no labels"
                )
            if self.io.output.name != self.output.tensor:
                name = clip(self.io.output.name)
                raise ValueError(f"io.output.name is {name}; an embedding's is {self.output.tensor!r}")
        elif len(self.labels) != width:
            raise ValueError(
                f"labels has {len(self.labels)} entries but io.output.shape says {width} classes; "
                "one label per class"
                + ("" if self.labels else ' (a model without labels is an embedding: "output": {"kind": "embedding"})')
            )
        tokens = self.io.patch_tokens
        if self.output.patch_tokens and (tokens is None or tokens.name != self.output.tensors[1]):
            got = "absent" if tokens is None else f"named {clip(tokens.name)}"
            raise ValueError(
                f"output.patch_tokens is true but io.patch_tokens is {got}; expected {self.output.tensors[1]!r}"
            )
        if tokens is not None and not self.output.patch_tokens:
            raise ValueError("io.patch_tokens is set but output.patch_tokens is not true")
        _, _, h, w = self.io.input.shape
        if (self.preprocess.height, self.preprocess.width) != (h, w):
            raise ValueError(
                f"preprocess size {self.preprocess.height}x{self.preprocess.width} differs from the "
                f"model input {h}x{w} (io.input.shape)"
            )
        if self.image_sizes is not None and (h != w or h not in self.image_sizes.sizes):
            raise ValueError(f"io.input's {h}x{w} is not one of image_sizes.sizes {list(self.image_sizes.sizes)}")
        return self

    @property
    def sizes(self) -> tuple[int, ...]:
        """The square sides the export answers at: image_sizes.sizes, or () for one fixed size."""
        return tuple(self.image_sizes.sizes) if self.image_sizes else ()

    # convenience
    @property
    def chw(self) -> tuple[int, int, int]:
        return tuple(self.io.input.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        """Values per output row: the number of classes, or the embedding's dimension."""
        return int(self.io.output.shape[1])

    @property
    def is_embedding(self) -> bool:
        return self.output.is_embedding

    @property
    def patch_shape(self) -> tuple[int, int] | None:
        """(patches, width) of the patch tokens; None when the export does not return them."""
        tokens = self.io.patch_tokens
        return (int(tokens.shape[1]), int(tokens.shape[2])) if tokens is not None else None


def read_json_bounded(path: Path, what: str) -> Any:
    """JSON from a small file next to the artifacts; ArtifactError for unreadable, huge, deep or invalid."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ArtifactError(f"{path}: {size} bytes is larger than a {what} can be ({MAX_JSON_BYTES}); {FIX}")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except PermissionError as exc:
        raise ArtifactError(
            f"{path}: cannot read the {what} ({exc.strerror}); make it readable by this user (e.g. chmod a+r)"
        ) from None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read the {what} ({exc.strerror or exc}); {FIX}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({clip(str(exc))}); {FIX}") from None
    except RecursionError:
        raise ArtifactError(f"{path}: JSON nested too deeply to be a {what}; {FIX}") from None


def parse_manifest(data: Any, source: Path) -> Manifest:
    """Validate manifest data; ArtifactError (exit 2) with one line naming each bad key."""
    if not isinstance(data, dict):
        raise ArtifactError(f"{source}: expected a JSON object, got {type(data).__name__}; {FIX}")
    fmt = data.get("format")
    if fmt != MANIFEST_FORMAT:
        raise ArtifactError(
            f'{source}: "format" is {clip(fmt)}, expected {MANIFEST_FORMAT!r}; this is not a vitdeploy manifest; {FIX}'
        )
    version = data.get("version")
    if type(version) is not int or version < 1 or version > MANIFEST_VERSION:
        raise ArtifactError(
            f"{source}: manifest version {clip(version)} is not supported (this vitdeploy "
            f"reads version {MANIFEST_VERSION}); upgrade vitdeploy or {FIX}"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ArtifactError(format_validation_error(exc, str(source)) + f"; {FIX}") from None


__all__ = [
    "FIX",
    "HubRecord",
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "Manifest",
    "parse_manifest",
    "read_json_bounded",
]
