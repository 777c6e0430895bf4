"""transformers' CLIP image tower: ``CLIPVisionModel``, ``CLIPVisionModelWithProjection`` and the vision half of a
``CLIPModel`` checkpoint -> vitdeploy naming and config (what ``convert.py`` reads for CLIP).

The tower is a ViT with a LayerNorm before the blocks (``pre_layrnorm`` -> ``norm_pre``; the patch convolution
has no bias), QuickGELU by default (``hidden_act``), LayerNorm eps 1e-5, ``post_layernorm`` on the pooled class
token (our final ``norm``: the class token is the same whether every token or that one is normed) and, with a
projection, ``visual_projection`` without bias (our ``proj``). The embedding is what transformers returns:
``image_embeds`` / ``get_image_features`` with the projection, ``pooler_output`` without.
A ``CLIPModel``'s text tower, text projection and logit scale are not part of the image tower: dropped here.

Keys: ``vision_model.`` is stripped by ``convert.py`` (``MODEL_TYPES``); the per-layer names are read by its
layer table with the entries below (``self_attn.q_proj`` ... ``layer_norm1``); the class embedding (width,) and
the position table (positions, width) take our shapes in :func:`clip_shapes`.
"""

from __future__ import annotations

from typing import Any

#: config.json model types of the CLIP image tower, and the prefix of its keys
CLIP_MODEL_TYPES = {"clip": "vision_model.", "clip_vision_model": "vision_model."}
#: transformers' CLIPVisionConfig defaults where they differ from its ViTConfig's
CLIP_DEFAULTS = {"patch_size": 32, "layer_norm_eps": 1e-5, "hidden_act": "quick_gelu"}
#: top-level tensors (after ``vision_model.``) -> ours
CLIP_TOP = {
    "embeddings.class_embedding": "cls_token",
    "embeddings.position_embedding.weight": "pos_embed",
    "embeddings.patch_embedding.weight": "patch_embed.proj.weight",
    "pre_layrnorm.weight": "norm_pre.weight",
    "pre_layrnorm.bias": "norm_pre.bias",
    "post_layernorm.weight": "norm.weight",
    "post_layernorm.bias": "norm.bias",
    "visual_projection.weight": "proj.weight",
}
#: per-layer module names -> ours ("q"/"k"/"v" are gathered into qkv by convert.py)
CLIP_LAYER = {
    "layer_norm1": "norm1",
    "layer_norm2": "norm2",
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.out_proj": "attn.proj",
}
#: what a CLIPModel checkpoint holds beside the image tower (and the position ids older files stored)
CLIP_DROPPED = ("text_model.", "text_projection.", "logit_scale", "embeddings.position_ids")


def vision_meta(config: dict[str, Any]) -> dict[str, Any]:
    """The config of the image tower: a CLIPModel's ``vision_config`` (model type ``clip_vision_model``), or the
    config itself (every other model type)."""
    if config.get("model_type") != "clip":
        return config
    vision = config.get("vision_config")
    return {"model_type": "clip_vision_model", **(vision if isinstance(vision, dict) else {})}


def clip_shapes(out: dict[str, Any]) -> None:
    """transformers' class embedding (width,) and position table (positions, width) in our shapes, in place."""
    cls, pos = out.get("cls_token"), out.get("pos_embed")
    if cls is not None and cls.ndim == 1:
        out["cls_token"] = cls.reshape(1, 1, -1)
    if pos is not None and pos.ndim == 2:
        out["pos_embed"] = pos.unsqueeze(0)


def clip_family(state: dict[str, Any]) -> dict[str, Any]:
    """The ViTConfig fields of a CLIP tower, from its converted tensors."""
    proj = state.get("proj.weight")
    return {
        "norm_pre": "norm_pre.weight" in state,
        "proj_dim": int(proj.shape[0]) if proj is not None and proj.ndim == 2 else 0,
    }
