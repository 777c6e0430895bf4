"""Hugging Face: a ``save_pretrained`` directory of ViT / DeiT / DINOv2 (``config.json`` with ``model_type``,
``model.safetensors`` or ``pytorch_model.bin``, sharded or not, ``preprocessor_config.json``), or a weights
file inside it. The key conversion and config reading are the pure functions of ``convert.py`` beside this reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ....base.errors import CheckpointError
from ....base.preprocess_spec import CLIP_MEAN, CLIP_STD, PreprocessSpec
from ....base.vit_schema import ViTConfig
from ...provenance import (
    CHECKPOINT,
    FAST_PROCESSOR_LEVELS,
    LIBRARY,
    TRANSPARENCY_CONVERTED,
    TRANSPARENCY_REFUSED,
    Preprocessing,
    describe_spec,
    fast_processor_differs,
    mirror_record,
    override_hint,
)
from ..base import LoadOptions, ReadConfig, Reader, Source
from ..shared import check_stated_variant, read_json
from . import convert as convert_hf

PREPROCESSOR_CONFIG = "preprocessor_config.json"
#: The image processor transformers pairs with each model type (AutoImageProcessor), where the folder names none.
_PROCESSOR_BY_MODEL_TYPE = {
    "dinov2": "BitImageProcessor",
    "dinov2_with_registers": "BitImageProcessor",
    "clip": "CLIPImageProcessor",
    "clip_vision_model": "CLIPImageProcessor",
    **{model_type: "SiglipImageProcessor" for model_type in convert_hf.siglip.SIGLIP_TYPES},
}
#: Processors whose class converts to RGB by default (do_convert_rgb = True); the others leave it unset.
_CONVERTS_RGB = {"BitImageProcessor", "CLIPImageProcessor", "SiglipImageProcessor"}


class HFReader(Reader):
    format = "hf"
    meta_file = "config.json"
    meta_hint = "a Hugging Face ViT config (no model_type)"
    stores = ("num_heads", "act", "layer_norm_eps", "pool")

    def claims_meta(self, meta: dict[str, Any]) -> bool:
        return convert_hf.is_hf_config(meta)

    def claims_keys(self, keys: set[str], where: Path) -> bool:
        """A bare HF state dict is recognised only to be refused: without config.json its heads, eps and
        labels are unknown."""
        if any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in keys):
            raise CheckpointError(
                f"{where}: a Hugging Face ViT state dict without its config.json; load the directory written by "
                "save_pretrained (config.json + weights) so heads, eps and labels are known"
            )
        return False

    def open_meta(self, meta_path: Path, meta: dict[str, Any]) -> Source:
        d = meta_path.parent
        return Source(self.format, d, _weight_files(d), meta, d, name=d.name)

    def open_file(self, path: Path, meta: dict[str, Any]) -> Source:
        return Source(self.format, path, [path], meta, path.parent, name=path.parent.name)

    def convert_keys(self, state: dict[str, Any]) -> dict[str, Any]:
        return convert_hf.convert_hf_state_dict(state)

    def config(self, src: Source, state: dict[str, Any], opts: LoadOptions) -> ReadConfig:
        head = state.get("head.weight")
        cfg = convert_hf.hf_vit_config(src.meta, int(head.shape[0]) if head is not None else 0, src.where, state)
        check_stated_variant(opts.variant, cfg, src.where)
        return ReadConfig(cfg, f"{CHECKPOINT}: config.json num_attention_heads")

    def labels(self, src: Source, cfg: ViTConfig) -> Optional[tuple[str, ...]]:
        return convert_hf.hf_labels(src.meta, cfg.num_classes, src.where)

    def preprocess(self, src: Source, cfg: ViTConfig, opts: LoadOptions) -> Preprocessing:
        pp_path = src.meta_dir / PREPROCESSOR_CONFIG if src.meta_dir else None
        if pp_path is not None and pp_path.is_file():
            return convert_hf.hf_preprocess(read_json(pp_path), cfg.image_size, pp_path)
        # no preprocessor_config.json: the model type's processor's defaults (ViTImageProcessor, CLIPImageProcessor,
        # SiglipImageProcessor: a bicubic stretch)
        size = cfg.image_size
        kind = _PROCESSOR_BY_MODEL_TYPE.get(src.meta.get("model_type"), "ViTImageProcessor")
        if kind == "CLIPImageProcessor":  # shorter side to the size, centre crop, bicubic, OpenAI's mean / std
            spec = PreprocessSpec(
                style="hf",
                height=size,
                width=size,
                shortest_edge=size,
                interpolation="bicubic",
                mean=CLIP_MEAN,
                std=CLIP_STD,
            )
        else:
            bicubic = kind == "SiglipImageProcessor"
            spec = PreprocessSpec(
                style="hf", height=size, width=size, interpolation="bicubic" if bicubic else "bilinear"
            )
        note = (
            f"{src.where}: no {PREPROCESSOR_CONFIG}; assumed transformers' {kind} defaults "
            f"({describe_spec(spec)}); {override_hint()}"
        )
        return Preprocessing.from_source(spec, f"{LIBRARY}: transformers {kind}", notes=(note,))

    def native_input(self, src: Source, cfg: ViTConfig, pre: Optional[Preprocessing]) -> Optional[int]:
        # transformers resamples a DINOv2 table to the processor's crop at every call
        return convert_hf.dinov2_input_size(src.meta, cfg, pre.spec, src.where) if pre is not None else None

    def pos_resample(self, src: Source, cfg: ViTConfig) -> Optional[str]:
        # DINOv2 always resamples; ViT / DeiT when called with interpolate_pos_encoding=True (plain bicubic)
        return "bicubic_antialias" if self.antialias(src) and src.meta.get("model_type") in DINOV2 else "bicubic"

    def antialias(self, src: Source) -> bool:
        if convert_hf.siglip.is_siglip(src.meta):  # SigLIP's interpolate_pos_encoding: bicubic, not antialiased
            return False
        return convert_hf.DINOV2_RESAMPLE_ANTIALIAS.get(src.meta.get("model_type"), True)  # registers model only

    def reference(self, src: Source) -> dict[str, Any]:
        """transformers' PIL image processor of this model (the one mirrored), its fast twin, and transparency."""
        pp_path = src.meta_dir / PREPROCESSOR_CONFIG if src.meta_dir else None
        pp = read_json(pp_path) if pp_path is not None and pp_path.is_file() else {}
        kind = str(pp.get("image_processor_type") or "").replace("FeatureExtractor", "ImageProcessor")
        kind = kind.removesuffix("Fast").removesuffix("Pil") or _PROCESSOR_BY_MODEL_TYPE.get(
            src.meta.get("model_type"), "ViTImageProcessor"
        )
        converts = pp.get("do_convert_rgb", kind in _CONVERTS_RGB)
        return mirror_record(
            "transformers",
            processor=f"{kind}Pil",
            fast_processor=kind,
            fast_differs=fast_processor_differs(kind),
            fast_max_levels=FAST_PROCESSOR_LEVELS.get(kind),
            transparency=TRANSPARENCY_CONVERTED if converts else TRANSPARENCY_REFUSED,
        )


#: model types whose transformers classes resample the position table to any input (DINOv2: at every call)
DINOV2 = tuple(convert_hf.DINOV2_RESAMPLE_ANTIALIAS)


def _weight_files(d: Path) -> list[Path]:
    for name in convert_hf.WEIGHTS_PREFERENCE:
        if not (d / name).is_file():
            continue
        if name not in convert_hf.INDEX_FILES:
            return [d / name]
        weight_map = read_json(d / name).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{d / name}: no weight_map")
        return [d / f for f in sorted(set(weight_map.values()))]
    raise CheckpointError(f"{d}: Hugging Face config.json but no weights ({', '.join(convert_hf.WEIGHTS_PREFERENCE)})")
