"""The one interface every checkpoint format implements, and what a reader is given.

A reader turns one format's files into vitdeploy's pieces, in the order ``load_checkpoint`` calls:

1. detect: ``claims_meta`` (its config file, e.g. a config.json, is this format's) or ``claims_keys``
   (a bare state dict's tensor names are this format's), then ``open_meta`` / ``open_file`` say which
   weight files and which config belong to the checkpoint (a :class:`Source`);
2. ``convert_keys``: the state dict renamed to vitdeploy's (timm's) parameter names; a pure function;
3. ``config``: the :class:`ViTConfig` (with where the head count came from and any assumption made);
4. ``labels`` and ``preprocess``: what the checkpoint says about its classes and its inputs (None: not stated);
5. ``native_input`` / ``antialias``: the input size the source library really runs the model at, when
   that is not the config's image size (Hugging Face DINOv2 only), and how it resamples position tables;
6. ``reference``: which library's preprocessing (processor, transform) the result mirrors.

Everything a reader does not override has the default below (nothing claimed, keys unchanged, nothing stated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from ...base.errors import CheckpointError
from ..provenance import Preprocessing

if TYPE_CHECKING:  # pragma: no cover
    from ...base.vit_schema import ViTConfig


@dataclass
class Source:
    """What a path turned out to be, before the tensors are converted."""

    format: str
    where: Path  # the path to name in messages
    weights: list[Path] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # model.json / config.json
    meta_dir: Optional[Path] = None
    state: Optional[dict[str, Any]] = None  # already read while detecting
    name: str = ""


@dataclass(frozen=True)
class LoadOptions:
    """What the caller (pipeline.yaml ``model:``) says about the checkpoint; None = not said."""

    variant: Optional[str] = None
    num_heads: Optional[int] = None
    act: Optional[str] = None
    layer_norm_eps: Optional[float] = None
    pool: Optional[str] = None


@dataclass(frozen=True)
class ReadConfig:
    """A reader's architecture: the config, where its head count came from, and what was assumed."""

    config: "ViTConfig"
    heads_origin: str = ""
    notes: tuple[str, ...] = ()


class Reader:
    """One checkpoint format (see the module doc for the order of the calls)."""

    #: the name in LoadedCheckpoint.source_format and messages ("vitdeploy", "hf", "timm", "torchvision")
    format: ClassVar[str] = ""
    #: the config file next to the weights that ``claims_meta`` reads (None: the format has none)
    meta_file: ClassVar[Optional[str]] = None
    #: what ``meta_file`` lacks when this reader does not claim it (for the error naming every format)
    meta_hint: ClassVar[str] = ""
    #: LoadOptions fields the checkpoint itself stores: a different value given is an error, not an override
    stores: ClassVar[tuple[str, ...]] = ()

    def claims_meta(self, meta: dict[str, Any]) -> bool:
        return False

    def claims_keys(self, keys: set[str], where: Path) -> bool:
        """A bare state dict's tensor names are this format's (a reader may raise to refuse a known-bad shape)."""
        return False

    def open_meta(self, meta_path: Path, meta: dict[str, Any]) -> Source:
        """The checkpoint that ``meta_path`` (this format's ``meta_file``, claimed) describes."""
        raise CheckpointError(f"{meta_path}: a {self.format} checkpoint has no config file")  # pragma: no cover

    def open_file(self, path: Path, meta: dict[str, Any]) -> Optional[Source]:
        """A weights file whose folder holds this format's ``meta_file``; None: not one of this checkpoint's files."""
        return None

    def convert_keys(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def config(self, src: Source, state: dict[str, Any], opts: LoadOptions) -> ReadConfig:
        raise NotImplementedError  # pragma: no cover

    def labels(self, src: Source, cfg: "ViTConfig") -> Optional[tuple[str, ...]]:
        return None

    def preprocess(self, src: Source, cfg: "ViTConfig", opts: LoadOptions) -> Optional[Preprocessing]:
        return None

    def native_input(self, src: Source, cfg: "ViTConfig", pre: Optional[Preprocessing]) -> Optional[int]:
        """The input side the source library runs the model at when it is not cfg.image_size; None otherwise.
        Asked only when the caller names no image size."""
        return None

    def antialias(self, src: Source) -> bool:
        """Whether the source library resamples position tables antialiased (bicubic either way)."""
        return True

    def pos_resample(self, src: Source, cfg: "ViTConfig") -> Optional[str]:
        """How the source library resamples the position table to any input size at every call
        (vocab.POS_RESAMPLES); None: it runs the model at one size only (export.image_sizes is refused)."""
        return None

    def reference(self, src: Source) -> dict[str, Any]:
        """Which library's preprocessing ``preprocess`` mirrors (``provenance.mirror_record``)."""
        return {"library": "vitdeploy"}
