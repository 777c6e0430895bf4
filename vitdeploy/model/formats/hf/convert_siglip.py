"""transformers' SigLIP image towers (``SiglipVisionModel``, the vision half of a ``SiglipModel`` checkpoint, and
``SiglipForImageClassification``; SigLIP 2 at a fixed resolution ships as these classes) -> vitdeploy naming and
config.

The tower is a ViT without a class token: the patch convolution (``padding="valid"``: an image side off the patch
grid loses its last rows and columns, as so400m/14 at 384 px does), a position table of the patches only
(``nn.Embedding``: one row per patch), pre-norm blocks with CLIP's names (``layer_norm1``,
``self_attn.{q,k,v,out}_proj``, ``layer_norm2``, ``mlp.fc1/fc2``: ``convert_clip.CLIP_LAYER``), ``post_layernorm``
on every token, then the attention-pooling head (``SiglipMultiheadAttentionPoolingHead``): a learned ``probe``
queries the tokens through ``nn.MultiheadAttention``, whose packed ``in_proj`` is timm's ``q`` (its first third) and
``kv`` (the rest), ``out_proj`` is ``proj``, then ``x + mlp(layernorm(x))``: our ``pool: map`` with timm's
``attn_pool.*`` names. Its output is ``pooler_output``, what ``SiglipModel.get_image_features`` returns. The
classifier reads the mean of ``post_layernorm``'s tokens (``pool: avg``) and never the head, whose tensors are
dropped. A ``SiglipModel``'s text tower and its logit scale and bias are not the image tower's: dropped.

transformers' NaFlex ``Siglip2*`` classes (``model_type`` ``siglip2``) resize every image to its own aspect ratio and
patch count (a sequence of variable length, a linear patch embedding, a position table resampled per image): they
are refused, naming the fixed-resolution checkpoints that load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ....base.errors import CheckpointError

#: model types of the SigLIP image tower (a whole SiglipModel / classifier config, or the vision config alone)
SIGLIP_TYPES = ("siglip", "siglip_vision_model")
#: transformers' NaFlex SigLIP 2 model types: refused (module docstring)
NAFLEX_TYPES = ("siglip2", "siglip2_vision_model")
#: the prefix of the image tower's keys in a SiglipModel / classifier checkpoint (a SiglipVisionModel saved by
#: transformers 5 has none; one saved by transformers 4 has it too)
PREFIX = "vision_model."
#: keys of the other tower and of the contrastive head: not the image tower's
DROPPED = ("text_model.", "logit_scale", "logit_bias")
#: transformers' SiglipVisionConfig defaults (where config.json leaves a key out)
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "vision_use_head": True,
}
#: top-level tower names -> ours (the head's packed in_proj is split by :func:`finish_state`)
TOP = {
    "embeddings.patch_embedding.weight": "patch_embed.proj.weight",
    "embeddings.patch_embedding.bias": "patch_embed.proj.bias",
    "embeddings.position_embedding.weight": "pos_embed",
    "post_layernorm.weight": "norm.weight",
    "post_layernorm.bias": "norm.bias",
    "head.probe": "attn_pool.latent",
    "head.attention.in_proj_weight": "attn_pool.in_proj.weight",
    "head.attention.in_proj_bias": "attn_pool.in_proj.bias",
    "head.attention.out_proj.weight": "attn_pool.proj.weight",
    "head.attention.out_proj.bias": "attn_pool.proj.bias",
    "head.layernorm.weight": "attn_pool.norm.weight",
    "head.layernorm.bias": "attn_pool.norm.bias",
    "head.mlp.fc1.weight": "attn_pool.mlp.fc1.weight",
    "head.mlp.fc1.bias": "attn_pool.mlp.fc1.bias",
    "head.mlp.fc2.weight": "attn_pool.mlp.fc2.weight",
    "head.mlp.fc2.bias": "attn_pool.mlp.fc2.bias",
}


def is_siglip(config: dict[str, Any]) -> bool:
    return config.get("model_type") in SIGLIP_TYPES


def naflex_reason(model_type: str) -> str:
    """Why transformers' NaFlex SigLIP 2 does not load, and what does (one line)."""
    return (
        f"model_type {model_type!r} is transformers' NaFlex SigLIP 2 (Siglip2VisionModel): it resizes each image to "
        "its own aspect ratio and patch count (max_num_patches) and resamples the position table per image, a "
        "variable-length input vitdeploy's fixed-size export does not run; the fixed-resolution SigLIP 2 "
        "checkpoints (google/siglip2-*-patch16-224/256/384/512, the Siglip classes) load"
    )


def refuse_naflex(config: dict[str, Any], where: Path) -> None:
    """CheckpointError for transformers' NaFlex SigLIP 2 (one line naming why and what loads instead)."""
    if config.get("model_type") in NAFLEX_TYPES:
        raise CheckpointError(f"{where}: {naflex_reason(config['model_type'])}")


def vision_config(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The image tower's config as one flat dict with transformers' defaults: ``vision_config`` of a SiglipModel /
    classifier config (its ``id2label`` kept), or a SiglipVisionModel's config itself; ``model_type`` kept."""
    if config.get("model_type") != "siglip":
        return {**VISION_DEFAULTS, **config}
    vision = config.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise CheckpointError(f"{where}: 'vision_config' must be an object, got {type(vision).__name__}")
    return {
        **VISION_DEFAULTS,
        **vision,
        "model_type": "siglip",
        **{k: config[k] for k in ("id2label", "architectures") if k in config},
    }


def finish_state(out: dict[str, Any]) -> None:
    """After the key conversion: the position table as (1, N, width), the head's packed ``in_proj`` split into
    timm's ``q`` and ``kv``, and a classifier's unused head dropped (in place)."""
    pos = out.get("pos_embed")
    if pos is not None and pos.ndim == 2:
        out["pos_embed"] = pos.unsqueeze(0)
    for kind in ("weight", "bias"):
        packed = out.pop(f"attn_pool.in_proj.{kind}", None)
        if packed is not None and packed.shape[0] % 3 == 0:
            width = packed.shape[0] // 3
            out[f"attn_pool.q.{kind}"], out[f"attn_pool.kv.{kind}"] = packed[:width], packed[width:]
        elif packed is not None:  # not a packed q/k/v: left for the strict load to name
            out[f"attn_pool.in_proj.{kind}"] = packed
    if "head.weight" in out:  # SiglipForImageClassification reads the mean token, never its pooling head
        for key in [k for k in out if k.startswith("attn_pool.")]:
            del out[key]


def family(config: dict[str, Any], state: dict[str, Any], where: Path, image: int, patch: int) -> dict[str, Any]:
    """The ViTConfig fields that make a ViT this SigLIP tower: no class token, its pooling (``map``: the head's
    attention pooling, pooler_output; ``avg``: the classifier's mean token), an input side off the patch grid."""
    if "head.weight" not in state and not config.get("vision_use_head", True):
        raise CheckpointError(
            f"{where}: vision_use_head is false: transformers' SigLIP tower then has no pooled output (pooler_output "
            "is None) and vitdeploy no embedding to export; load a checkpoint with its attention-pooling head"
        )
    return {
        "class_token": False,
        "pool": "avg" if "head.weight" in state else "map",
        "drop_remainder": bool(image % patch),
    }
