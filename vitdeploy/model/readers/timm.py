"""timm ``vision_transformer``: a state dict (.safetensors or a torch.save file), or a timm hub directory
(``config.json`` with ``architecture``, ``pretrained_cfg``, ``model_args``). The key conversion and config
inference are the pure functions of ``model/convert_timm.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ...base.errors import CheckpointError
from ...base.vit_schema import ViTConfig
from .. import convert_timm
from ..provenance import Preprocessing
from .base import LoadOptions, ReadConfig, Reader, Source


class TimmReader(Reader):
    format = "timm"
    meta_file = "config.json"
    meta_hint = "a timm config (no architecture)"
    stores = ()  # convert_timm.timm_vit_config checks what the hub config states against the options itself

    def claims_meta(self, meta: dict[str, Any]) -> bool:
        return convert_timm.is_timm_config(meta)

    def claims_keys(self, keys: set[str], where: Path) -> bool:
        return convert_timm.looks_like_timm(keys)

    def open_meta(self, meta_path: Path, meta: dict[str, Any]) -> Source:
        from .resolve import resolve_weights  # the weights are a bare timm state dict: detected by their keys

        d = meta_path.parent
        weights = [d / f for f in convert_timm.WEIGHT_FILES if (d / f).is_file()][:1]
        if not weights:
            raise CheckpointError(f"{d}: timm config.json but no {' or '.join(convert_timm.WEIGHT_FILES)}")
        src = resolve_weights(weights[0])
        if src.format != self.format:
            raise CheckpointError(f"{weights[0]}: config.json says timm but the weights are {src.format}")
        src.meta, src.meta_dir, src.name, src.where = meta, d, str(meta.get("architecture") or d.name), d
        return src

    def open_file(self, path: Path, meta: dict[str, Any]) -> Optional[Source]:
        return self.open_meta(path.parent / self.meta_file, meta) if path.name in convert_timm.WEIGHT_FILES else None

    def convert_keys(self, state: dict[str, Any]) -> dict[str, Any]:
        return convert_timm.convert_timm_state_dict(state)

    def config(self, src: Source, state: dict[str, Any], opts: LoadOptions) -> ReadConfig:
        cfg, heads_origin, notes = convert_timm.timm_vit_config(
            state,
            src.where,
            opts.variant,
            src.meta or None,
            num_heads=opts.num_heads,
            act=opts.act,
            layer_norm_eps=opts.layer_norm_eps,
            pool=opts.pool,
        )
        return ReadConfig(cfg, heads_origin, notes)

    def labels(self, src: Source, cfg: ViTConfig) -> Optional[tuple[str, ...]]:
        return convert_timm.timm_labels(src.meta, cfg.num_classes, src.where) if src.meta else None

    def preprocess(self, src: Source, cfg: ViTConfig, opts: LoadOptions) -> Preprocessing:
        return convert_timm.timm_preprocess(src.meta or None, cfg, src.where, opts.variant)
