"""The ViT network and its checkpoint loaders. Needs torch."""

from .vit import VARIANTS, ViTConfig, VisionTransformer, resample_pos_embed

__all__ = ["VARIANTS", "ViTConfig", "VisionTransformer", "resample_pos_embed"]
