"""vitdeploy's own format: a directory with ``model.json`` (``"format": "vitdeploy"``) and ``model.safetensors``.

Written by ``save_checkpoint``; everything is stated (the ViT config, labels, preprocessing), nothing assumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ...base.errors import CheckpointError
from ...base.preprocess_spec import PreprocessSpec
from ...base.vit_schema import ViTConfig
from ...base.vocab import CHECKPOINT_CONFIG, CHECKPOINT_WEIGHTS
from ..provenance import CHECKPOINT, Preprocessing
from .base import LoadOptions, ReadConfig, Reader, Source
from .shared import check_stated_variant

FORMAT, VERSION = "vitdeploy", 1


class VitdeployReader(Reader):
    format = FORMAT
    meta_file = CHECKPOINT_CONFIG
    stores = ("num_heads", "act", "layer_norm_eps", "pool")

    def claims_meta(self, meta: dict[str, Any]) -> bool:
        return meta.get("format") == FORMAT

    def open_meta(self, meta_path: Path, meta: dict[str, Any], where: Optional[Path] = None) -> Source:
        d = meta_path.parent
        return Source(
            FORMAT, where or meta_path, [d / CHECKPOINT_WEIGHTS], meta, d, name=str(meta.get("name") or d.name)
        )

    def open_file(self, path: Path, meta: dict[str, Any]) -> Optional[Source]:
        if path.name != CHECKPOINT_WEIGHTS:
            return None
        return self.open_meta(path.parent / CHECKPOINT_CONFIG, meta, where=path)

    def config(self, src: Source, state: dict[str, Any], opts: LoadOptions) -> ReadConfig:
        version = src.meta.get("version")
        if version != VERSION:
            raise CheckpointError(
                f"{src.where}: model.json version {version!r} is not supported (this vitdeploy "
                f"reads {VERSION}); upgrade vitdeploy"
            )
        try:
            cfg = ViTConfig.from_dict(dict(src.meta["vit"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{src.where}: invalid 'vit' config in model.json: {exc}") from exc
        check_stated_variant(opts.variant, cfg, src.where)
        return ReadConfig(cfg, f"{CHECKPOINT}: {CHECKPOINT_CONFIG}")

    def labels(self, src: Source, cfg: ViTConfig) -> tuple[str, ...]:
        labels = src.meta.get("labels")
        if not isinstance(labels, list) or len(labels) != cfg.num_classes:
            raise CheckpointError(
                f"{src.where}: 'labels' must be a list of {cfg.num_classes} names (one per class), got "
                f"{len(labels) if isinstance(labels, list) else type(labels).__name__}"
            )
        return tuple(str(x) for x in labels)

    def pos_resample(self, src: Source, cfg: ViTConfig) -> Optional[str]:
        # what the export that saved it states; otherwise timm's rule (our parameter names are timm's)
        return cfg.pos_resample if cfg.dynamic_size else "bicubic_antialias"

    def preprocess(self, src: Source, cfg: ViTConfig, opts: LoadOptions) -> Optional[Preprocessing]:
        if src.meta.get("preprocess") is None:
            return None
        try:
            spec = PreprocessSpec.from_dict(src.meta["preprocess"])
        except (TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{src.where}: invalid 'preprocess' in model.json: {exc}") from exc
        return Preprocessing.from_source(spec, f"{CHECKPOINT}: {CHECKPOINT_CONFIG}")
