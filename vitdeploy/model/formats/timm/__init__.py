"""timm ``vision_transformer``: a state dict (.safetensors or a torch.save file), or a timm hub directory
(``config.json`` with ``architecture``, ``pretrained_cfg``, ``model_args``). The key conversion and config
inference are the pure functions of ``convert.py`` beside this reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ....base.errors import CheckpointError
from ....base.vit_schema import ViTConfig
from ...provenance import Preprocessing, mirror_record
from ..base import LoadOptions, ReadConfig, Reader, Source
from ..shared import shorten, weight_keys
from . import convert as convert_timm
from . import convert_eva


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
        d = meta_path.parent
        weights = [d / f for f in convert_timm.WEIGHT_FILES if (d / f).is_file()][:1]
        if not weights:
            raise CheckpointError(f"{d}: timm config.json but no {' or '.join(convert_timm.WEIGHT_FILES)}")
        if str(meta.get("architecture") or "").startswith(convert_timm.TIMM_NAFLEX_PREFIX):
            raise CheckpointError(f"{d}: {convert_timm.naflexvit_reason(str(meta['architecture']))}")
        keys, state = weight_keys(weights[0])  # the weights are a bare timm state dict: told by their keys
        if not self.claims_keys(keys, weights[0]):
            raise CheckpointError(
                f"{weights[0]}: config.json says timm but these are not timm's tensor names "
                f"(patch_embed.proj, blocks.N); first keys: {shorten(keys, 6)}"
            )
        name = str(meta.get("architecture") or d.name)
        return Source(self.format, d, [weights[0]], meta=meta, meta_dir=d, state=state, name=name)

    def open_file(self, path: Path, meta: dict[str, Any]) -> Optional[Source]:
        return self.open_meta(path.parent / self.meta_file, meta) if path.name in convert_timm.WEIGHT_FILES else None

    def convert_keys(self, state: dict[str, Any]) -> dict[str, Any]:
        return convert_timm.convert_timm_state_dict(state)

    def config(self, src: Source, state: dict[str, Any], opts: LoadOptions) -> ReadConfig:
        rope = None
        if convert_eva.is_eva_state(_raw_keys(src)):  # timm eva.py: what its architecture says of rotation
            arch = convert_eva.eva_architecture(src.meta, opts.variant, src.where)
            rope = convert_eva.eva_family(arch, src.meta, src.where)
        cfg, heads_origin, notes = convert_timm.timm_vit_config(
            state,
            src.where,
            opts.variant,
            src.meta or None,
            num_heads=opts.num_heads,
            act=opts.act,
            layer_norm_eps=opts.layer_norm_eps,
            pool=opts.pool,
            rope=rope,
        )
        return ReadConfig(cfg, heads_origin, notes)

    def labels(self, src: Source, cfg: ViTConfig) -> Optional[tuple[str, ...]]:
        return convert_timm.timm_labels(src.meta, cfg.num_classes, src.where) if src.meta else None

    def pos_resample(self, src: Source, cfg: ViTConfig) -> Optional[str]:
        return "bicubic_antialias"  # dynamic_img_size=True: resample_abs_pos_embed, bicubic, antialiased

    def preprocess(self, src: Source, cfg: ViTConfig, opts: LoadOptions) -> Preprocessing:
        return convert_timm.timm_preprocess(src.meta or None, cfg, src.where, opts.variant)

    def reference(self, src: Source) -> dict[str, Any]:
        return mirror_record("timm", transform="timm.data.create_transform(**resolve_data_config(model=model))")


def _raw_keys(src: Source) -> set[str]:
    """The checkpoint's own tensor names, before convert_keys (a safetensors header is read again: no tensors)."""
    if src.state is not None:
        return set(src.state)
    return weight_keys(src.weights[0])[0] if src.weights else set()
