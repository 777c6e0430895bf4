"""EVA-02's 2-D rotary position embedding (Su et al., 2021; Fang et al., 2023), as timm computes it.

timm's ``RotaryEmbeddingCat`` (``timm/layers/pos_embed_sincos.py``, ``rope_type='cat'``, ``in_pixels=False``):
for a head width ``d``, ``d // 4`` frequencies ``1 / 10000 ** (i / (d // 4))``; each patch at row ``y``, column
``x`` of an ``h x w`` grid has the positions ``y / h * g`` and ``x / w * g`` (``g``: ``ref_feat_shape``, the grid
the model was trained at; unscaled without it); the angles are the row's frequencies then the column's, each
repeated twice (interleaved pairs), and ``x * cos + rot(x) * sin`` rotates each pair ``(x0, x1)`` to
``(x0 cos - x1 sin, x1 cos + x0 sin)``. The class token and registers are not rotated.

The table is computed from the grid at every call, in float32 as timm does it: constants in a fixed-size
export (the exporter folds them), a few small ops on the input's grid in an export for several sizes.
"""

from __future__ import annotations

import torch

#: timm's rope_temperature for every EVA-02 architecture (another is refused by the timm reader).
ROPE_TEMPERATURE = 10000.0


def rope_table(height: int | torch.SymInt, width: int | torch.SymInt, head_dim: int, ref_grid: int) -> torch.Tensor:
    """(height * width, 2 * head_dim): the sines then the cosines of every patch's angles (row-major grid)."""
    bands = head_dim // 4
    freqs = 1.0 / (ROPE_TEMPERATURE ** (torch.arange(0, bands, 1, dtype=torch.int64).to(torch.float32) / bands))
    rows = torch.arange(height, dtype=torch.int64).to(torch.float32)
    cols = torch.arange(width, dtype=torch.int64).to(torch.float32)
    if ref_grid:  # timm's _build_grid: t / feat_shape * ref_feat_shape
        rows = rows / height * ref_grid
        cols = cols / width * ref_grid
    grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1)  # (h, w, 2)
    angles = (grid.unsqueeze(-1) * freqs).flatten(-2).flatten(0, -2)  # (h*w, 2 * bands): row's, then column's
    return torch.cat([angles.sin().repeat_interleave(2, -1), angles.cos().repeat_interleave(2, -1)], dim=-1)


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate (..., tokens, head_dim) by the table's angles (timm ``apply_rot_embed_cat``, interleaved): computed
    at the float32 table's precision, returned in ``x``'s dtype (a half-precision network stays half)."""
    sin, cos = table.chunk(2, dim=-1)
    pairs = x.unflatten(-1, (-1, 2))
    turned = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)  # (-x1, x0, -x3, x2, ...)
    return (x * cos + turned * sin).to(x.dtype)


def rotate_patches(x: torch.Tensor, table: torch.Tensor, prefix: int) -> torch.Tensor:
    """(B, heads, prefix + patches, head_dim) with the patch tokens rotated, the prefix tokens as they are."""
    if not prefix:
        return rotate(x, table)
    return torch.cat([x[:, :, :prefix], rotate(x[:, :, prefix:], table)], dim=2)
