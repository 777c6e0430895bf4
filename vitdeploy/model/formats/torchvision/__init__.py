"""torchvision ``vit_*``: a state dict (``conv_proj``, ``encoder.layers``). The key conversion and the
weights' transforms are the pure functions of ``convert.py`` beside this reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ....base.vit_schema import ViTConfig
from ...provenance import Preprocessing, mirror_record
from ..base import LoadOptions, ReadConfig, Reader, Source
from . import convert as convert_torchvision


class TorchvisionReader(Reader):
    format = "torchvision"
    stores = ("pool",)  # a torchvision ViT always reads the class token

    def claims_keys(self, keys: set[str], where: Path) -> bool:
        return convert_torchvision.looks_like_torchvision(keys)

    def convert_keys(self, state: dict[str, Any]) -> dict[str, Any]:
        return convert_torchvision.convert_torchvision_state_dict(state)

    def config(self, src: Source, state: dict[str, Any], opts: LoadOptions) -> ReadConfig:
        cfg, heads_origin = convert_torchvision.torchvision_vit_config(
            state, src.where, opts.variant, num_heads=opts.num_heads, act=opts.act, layer_norm_eps=opts.layer_norm_eps
        )
        return ReadConfig(cfg, heads_origin)

    def preprocess(self, src: Source, cfg: ViTConfig, opts: LoadOptions) -> Preprocessing:
        return convert_torchvision.torchvision_preprocess(cfg, src.where)

    def reference(self, src: Source) -> dict[str, Any]:
        return mirror_record("torchvision", transform="the weights' transforms() (torchvision.models.*_Weights)")
