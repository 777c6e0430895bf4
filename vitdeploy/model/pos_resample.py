"""The position table at the input's grid, as the checkpoint's library resamples it at every call.

transformers (DINOv2, DINOv2 with registers, ViT / DeiT with ``interpolate_pos_encoding``) and timm
(``dynamic_img_size``) run a ViT at any multiple of the patch: the learned table is resampled bicubically
(``F.interpolate``, half-pixel centres) from its own grid to the input's, antialiased for timm and the
registers model (``ViTConfig.pos_resample``).

Eager PyTorch calls that very ``F.interpolate``. An exported graph cannot: ONNX's antialiased cubic
``Resize`` is not PyTorch's everywhere and TensorRT has none, so under ``torch.export`` the same
resampling is written as two small matrices computed in the graph from the input's size (the taps and
weights PyTorch's kernels use: Keys' cubic with a = -0.75 and clamped borders; antialiased, PIL's cubic
with a = -0.5 stretched by the scale, out-of-range taps dropped and the rest renormalised), then
``rows @ table @ cols^T``. Both are judged against eager at every exported size (the export's
validation); ``tests/model/test_pos_resample.py`` checks the matrices against ``F.interpolate``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Keys' cubic convolution coefficient: PyTorch's bicubic (OpenCV's), and its antialiased bicubic (PIL's).
CUBIC_A, CUBIC_A_ANTIALIAS = -0.75, -0.5


def _cubic(x: torch.Tensor, a: float) -> torch.Tensor:
    """Keys' cubic kernel at distances ``x``."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def bicubic_matrix(out_size: int | torch.SymInt, in_size: int, antialias: bool) -> torch.Tensor:
    """(out_size, in_size) float32 weights: row i is what ``F.interpolate(mode="bicubic", align_corners=False,
    antialias=antialias)`` sums for output i along one axis. ``out_size`` may be symbolic (torch.export)."""
    i = torch.arange(out_size, dtype=torch.float32)
    j = torch.arange(in_size, dtype=torch.float32)
    scale = in_size / (i[-1:] + 1)  # in / out, a tensor: no Python branch on a symbolic size
    if antialias:
        support = torch.where(scale >= 1, 2.0 * scale, torch.full_like(scale, 2.0))
        inv = torch.where(scale >= 1, 1.0 / scale, torch.ones_like(scale))
        center = scale * (i + 0.5)
        lo = torch.clamp(torch.floor(center - support + 0.5), min=0.0)
        hi = torch.clamp(torch.floor(center + support + 0.5), max=float(in_size))
        w = _cubic((j[None, :] - center[:, None] + 0.5) * inv[:, None], CUBIC_A_ANTIALIAS)
        w = torch.where((j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None]), w, torch.zeros_like(w))
        return w / w.sum(dim=1, keepdim=True)
    src = (i + 0.5) * scale - 0.5
    x0 = torch.floor(src)
    t = src - x0
    weights = torch.zeros(i.shape[0], in_size)
    for k in (-1, 0, 1, 2):
        tap = torch.clamp(x0 + k, 0, in_size - 1)
        weights = weights + _cubic(t - k, CUBIC_A)[:, None] * (tap[:, None] == j[None, :]).float()
    return weights


def resample_grid(
    table: torch.Tensor, grid: int, height: int | torch.SymInt, width: int | torch.SymInt, antialias: bool
) -> torch.Tensor:
    """A (1, grid*grid, D) patch position table at a (height, width) grid: (1, height*width, D), float32
    resampling as the libraries do (``F.interpolate`` eager; its matrices under torch.export)."""
    dim = table.shape[-1]
    square = table.reshape(grid, grid, dim).float()
    if not torch.compiler.is_exporting():
        out = F.interpolate(
            square.permute(2, 0, 1)[None],
            size=(int(height), int(width)),
            mode="bicubic",
            align_corners=False,
            antialias=antialias,
        )
        return out[0].permute(1, 2, 0).reshape(1, -1, dim).to(table.dtype)
    rows = bicubic_matrix(height, grid, antialias).to(square.device)
    cols = bicubic_matrix(width, grid, antialias).to(square.device)
    out = (rows @ square.reshape(grid, grid * dim)).reshape(-1, grid, dim)  # (H, g, D)
    out = torch.matmul(cols, out)  # (W, g) @ (H, g, D) -> (H, W, D)
    return out.reshape(1, -1, dim).to(table.dtype)


def position_table(pos_embed: torch.Tensor, prefix: int, grid: int, height, width, antialias: bool) -> torch.Tensor:
    """The whole table (the ``prefix`` rows as they are, then the patch rows resampled) at (height, width)."""
    patches = resample_grid(pos_embed[:, prefix:], grid, height, width, antialias)
    return torch.cat([pos_embed[:, :prefix], patches], dim=1) if prefix else patches
