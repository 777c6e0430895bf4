"""The ViT network and its checkpoint loaders. Needs torch."""

from .checkpoints import LoadedCheckpoint, detect_format, load_checkpoint, save_checkpoint
from .vit import VARIANTS, VisionTransformer, ViTConfig, resample_pos_embed

__all__ = [
    "VARIANTS",
    "LoadedCheckpoint",
    "ViTConfig",
    "VisionTransformer",
    "detect_format",
    "load_checkpoint",
    "resample_pos_embed",
    "save_checkpoint",
]
