"""OpenCLIP: a folder as the Hub holds it (``open_clip_config.json`` with ``model_cfg`` and ``preprocess_cfg``,
beside ``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``), a weights file inside it, or an OpenCLIP
state dict alone (its tensor names). Its image tower loads as an embedding model: ``encode_image``. Read without the
open_clip package; the key conversion and config reading are the pure functions of ``convert.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ....base.errors import CheckpointError
from ....base.vit_schema import ViTConfig
from ...provenance import Preprocessing, mirror_record
from ..base import LoadOptions, ReadConfig, Reader, Source
from ..shared import read_state_dict, shorten
from . import convert as convert_oc


class OpenClipReader(Reader):
    format = "open_clip"
    meta_file = convert_oc.CONFIG_FILE
    meta_hint = "an OpenCLIP config (no model_cfg)"
    stores = ()  # convert_oc.open_clip_vit_config checks what the config states against the options itself

    def claims_meta(self, meta: dict[str, Any]) -> bool:
        return convert_oc.is_open_clip_config(meta)

    def claims_keys(self, keys: set[str], where: Path) -> bool:
        return convert_oc.looks_like_open_clip(keys)

    def open_meta(self, meta_path: Path, meta: dict[str, Any]) -> Source:
        d = meta_path.parent
        weights = [d / f for f in convert_oc.WEIGHT_FILES if (d / f).is_file()][:1]
        if not weights:
            raise CheckpointError(f"{d}: {meta_path.name} but no {' or '.join(convert_oc.WEIGHT_FILES)}")
        return self._source(d, weights[0], meta, d.name)

    def open_file(self, path: Path, meta: dict[str, Any]) -> Optional[Source]:
        if path.name not in convert_oc.WEIGHT_FILES:
            return None
        return self._source(path, path, meta, path.parent.name)

    def _source(self, where: Path, weights: Path, meta: dict[str, Any], name: str) -> Source:
        """The tensors read and converted here: the config decides where ``ln_post`` goes (norm or fc_norm)."""
        state = read_state_dict(weights)
        if not convert_oc.looks_like_open_clip(set(state)):
            raise CheckpointError(
                f"{weights}: {convert_oc.CONFIG_FILE} says OpenCLIP but these are not its tensor names "
                f"(visual.conv1, visual.transformer.resblocks.N); first keys: {shorten(state, 6)}"
            )
        state = convert_oc.convert_open_clip_state_dict(state, meta)
        return Source(self.format, where, [weights], meta=meta, meta_dir=weights.parent, state=state, name=name)

    def convert_keys(self, state: dict[str, Any]) -> dict[str, Any]:
        return convert_oc.convert_open_clip_state_dict(state)  # a bare state dict (a folder's: converted already)

    def config(self, src: Source, state: dict[str, Any], opts: LoadOptions) -> ReadConfig:
        cfg, origin, notes = convert_oc.open_clip_vit_config(
            state, src.meta, src.where, num_heads=opts.num_heads, act=opts.act, layer_norm_eps=opts.layer_norm_eps
        )
        if not src.meta:
            notes += (
                f"{src.where.name}: no {convert_oc.CONFIG_FILE}: assumed {cfg.act} (OpenAI's weights run QuickGELU: "
                f"model.activation: quick_gelu), LayerNorm eps {cfg.layer_norm_eps} and class-token pooling",
            )
        return ReadConfig(cfg, origin, notes)

    def preprocess(self, src: Source, cfg: ViTConfig, opts: LoadOptions) -> Preprocessing:
        return convert_oc.open_clip_preprocess(src.meta or {}, cfg, src.where)

    def reference(self, src: Source) -> dict[str, Any]:
        return mirror_record(
            "open_clip_torch", transform="open_clip.create_model_and_transforms(...)[2] (image_transform, eval)"
        )
