"""A Vision Transformer written from the paper's four equations (Dosovitskiy et al., 2021).

    z0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos                (1)  patch + class + position
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                            (2)  pre-norm attention block
    z_l  = MLP(LN(z'_l)) + z'_l                                  (3)  pre-norm MLP block
    y    = LN(z_L^0)                                             (4)  class token -> head

Every size is a field of :class:`ViTConfig`; the named variants are data in ``VARIANTS``. So are the
close relatives people ship: prefix tokens (class, DeiT's distillation token, registers), average
pooling over the patch tokens (with ``fc_norm`` after the pool), layer scale (DeiT III, DINOv2),
qk-norm, and position tables with or without the prefix positions (timm's ``no_embed_class``).
Parameter names are timm's, so a timm state dict loads as it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..vit_schema import family_problems
from ..vocab import POOLS


#: MLP activations: our name -> torch.nn.functional.gelu's ``approximate`` argument.
GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}
ACTIVATIONS: tuple[str, ...] = tuple(GELU_APPROXIMATE)


@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 224
    patch_size: int = 16
    in_channels: int = 3
    width: int = 768
    depth: int = 12
    heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    layer_norm_eps: float = 1e-6
    num_classes: int = 1000
    pos_embed: str = "learned"  # or "sincos" (fixed 2-D sinusoidal)
    act: str = "gelu"  # MLP activation: "gelu" (exact, erf) or "gelu_tanh" (tanh approximation)
    class_token: bool = True  # a learned class token first in the sequence
    distilled: bool = False  # DeiT's distillation token after it, with its own head; the two heads' logits averaged
    reg_tokens: int = 0  # register tokens after the class token (DINOv2 registers), never pooled
    # "token": the class token; "avg": the mean of the patch tokens (prefix tokens left out); "token_avg": the
    # class token and the mean patch token side by side, a head over 2 x width (transformers' DINOv2 classifiers)
    pool: str = "token"
    fc_norm: bool = False  # the final LayerNorm after the pooling (timm fc_norm) instead of on every token
    layer_scale: bool = False  # per-channel scales on each residual branch (timm ls1/ls2.gamma)
    qk_norm: bool = False  # LayerNorm over each head's queries and keys before attention
    pos_embed_prefix: bool = True  # the position table has rows for the prefix tokens (False: timm no_embed_class)

    def __post_init__(self) -> None:
        sizes = {"image_size": self.image_size, "patch_size": self.patch_size, "in_channels": self.in_channels,
                 "width": self.width, "depth": self.depth, "heads": self.heads}
        bad = [f"{k} {v!r}" for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
        if bad:  # checked first: a zero or a string must not reach the arithmetic below
            raise ValueError(f"invalid ViT config: sizes must be positive integers, got {', '.join(bad)}")
        problems = []
        if self.image_size % self.patch_size:
            problems.append(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.width % self.heads:
            problems.append(f"width {self.width} is not divisible by heads {self.heads}")
        if self.act not in ACTIVATIONS:
            problems.append(f"act must be one of {', '.join(ACTIVATIONS)}, got {self.act!r}")
        if self.pos_embed not in ("learned", "sincos"):
            problems.append(f"pos_embed must be 'learned' or 'sincos', got {self.pos_embed!r}")
        if min(self.image_size, self.patch_size, self.in_channels, self.width, self.depth, self.heads) <= 0:
            problems.append("sizes must be positive")
        if isinstance(self.reg_tokens, bool) or not isinstance(self.reg_tokens, int) or self.reg_tokens < 0:
            problems.append(f"reg_tokens must be an integer >= 0, got {self.reg_tokens!r}")
        if self.pool not in POOLS:
            problems.append(f"pool must be one of {', '.join(POOLS)}, got {self.pool!r}")
        else:
            problems += family_problems(class_token=self.class_token, distilled=self.distilled,
                                        reg_tokens=self.reg_tokens, pool=self.pool, fc_norm=self.fc_norm)
        if self.num_classes < 0:
            problems.append(f"num_classes must be >= 0, got {self.num_classes}")
        if problems:
            raise ValueError("invalid ViT config: " + "; ".join(problems))

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class, distillation, registers."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def pos_len(self) -> int:
        """Rows of the position table."""
        return self.num_patches + (self.num_prefix_tokens if self.pos_embed_prefix else 0)

    @property
    def mlp_dim(self) -> int:
        return int(round(self.width * self.mlp_ratio))

    @property
    def pooled_width(self) -> int:
        """Features the head reads: ``width``, or twice that for ``token_avg``."""
        return 2 * self.width if self.pool == "token_avg" else self.width

    @property
    def reads_class_token_only(self) -> bool:
        """The logits depend on the last block's class-token row alone (no pooling over the patches, no
        distillation head): what makes the ORT graph's class-token-only last block exact."""
        return self.pool == "token" and not self.distilled

    def family_summary(self) -> str:
        """What sets this ViT apart from the paper's (prefix tokens, pooling, ...); "" for the paper's."""
        parts = []
        if not self.class_token:
            parts.append("no class token")
        if self.distilled:
            parts.append("distillation token (two heads averaged)")
        if self.reg_tokens:
            parts.append(f"{self.reg_tokens} register token{'s' if self.reg_tokens > 1 else ''}")
        if self.pool == "token_avg":
            parts.append("class token + mean patch token (DINOv2 classifier)")
        elif self.pool != "token":
            parts.append("average pooling" + (" + fc_norm" if self.fc_norm else ""))
        elif self.fc_norm:
            parts.append("fc_norm")
        parts += [name for name, on in (("layer scale", self.layer_scale), ("qk-norm", self.qk_norm),
                                        ("no prefix positions", not self.pos_embed_prefix)) if on]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ViTConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ViT config keys {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**data)

    def replace(self, **changes: Any) -> "ViTConfig":
        return replace(self, **changes)


def _variant(width: int, depth: int, heads: int, mlp: int, patch: int) -> ViTConfig:
    return ViTConfig(patch_size=patch, width=width, depth=depth, heads=heads, mlp_ratio=mlp / width)


# The paper's Table 1 (B/L/H) plus DeiT's Ti/S, at 224 with patch 16 and 32 (H: 14).
_SIZES = {"tiny": (192, 12, 3, 768), "small": (384, 12, 6, 1536), "base": (768, 12, 12, 3072),
          "large": (1024, 24, 16, 4096), "huge": (1280, 32, 16, 5120)}
VARIANTS: dict[str, ViTConfig] = {
    f"vit_{size}_patch{patch}_224": _variant(*dims, patch)
    for size, dims in _SIZES.items()
    for patch in ((14,) if size == "huge" else (16, 32))
}


def sincos_position_embedding(grid: int, width: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding, (1, grid*grid, width)."""
    if width % 4:
        raise ValueError(f"sincos position embedding needs width divisible by 4, got {width}")
    ys, xs = torch.meshgrid(torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(width // 4, dtype=torch.float32) / (width // 4 - 1 if width > 4 else 1))
    y = ys.flatten()[:, None] * omega[None, :]
    x = xs.flatten()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None]


class PatchEmbed(nn.Module):
    """Split the image into patches and project each with one strided convolution."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cfg.in_channels, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, cfg.width * 3, bias=cfg.qkv_bias)
        self.proj = nn.Linear(cfg.width, cfg.width)
        if cfg.qk_norm:
            self.q_norm = nn.LayerNorm(cfg.width // cfg.heads, eps=cfg.layer_norm_eps)
            self.k_norm = nn.LayerNorm(cfg.width // cfg.heads, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)
        self.approximate = GELU_APPROXIMATE[cfg.act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # exact (erf) GELU as in the paper's reference code, or the tanh form (timm gelu_tanh, HF gelu_pytorch_tanh)
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg)
        if cfg.layer_scale:
            self.ls1, self.ls2 = LayerScale(cfg.width), LayerScale(cfg.width)
        else:
            self.ls1 = self.ls2 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))  # (2)
        return x + self.ls2(self.mlp(self.norm2(x)))  # (3)


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (Touvron et al., 2021: CaiT / DeiT III)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class VisionTransformer(nn.Module):
    """ViT classifier. ``forward`` returns logits; ``forward_features`` the pooled features."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        # prefix tokens, in timm's order: class, distillation, registers
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.width)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.width)) if cfg.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, cfg.width)) if cfg.reg_tokens else None
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.pos_len, cfg.width))
        else:
            prefix = cfg.pos_len - cfg.num_patches
            table = torch.cat([torch.zeros(1, prefix, cfg.width), sincos_position_embedding(cfg.grid, cfg.width)], dim=1)
            self.register_buffer("pos_embed", table, persistent=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        norm = lambda: nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)  # noqa: E731
        self.norm = nn.Identity() if cfg.fc_norm else norm()
        self.fc_norm = norm() if cfg.fc_norm else nn.Identity()
        self.head = nn.Linear(cfg.pooled_width, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.head_dist = (nn.Linear(cfg.width, cfg.num_classes) if cfg.num_classes else nn.Identity()) if cfg.distilled else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Truncated-normal weights (std 0.02), zero biases, unit LayerNorms, as timm/HF do."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for token in (self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward_tokens(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, prefix + patches, width): every token after the last block and ``norm``."""
        x = self.patch_embed(pixel_values)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if self.cfg.pos_embed_prefix:
            x = torch.cat([*prefix, x], dim=1) + self.pos_embed  # (1)
        else:  # the table covers the patches only; the prefix tokens carry no position
            x = torch.cat([*prefix, x + self.pos_embed], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, pooled_width): the class token (equation 4), the mean patch token (then
        fc_norm), or the two side by side."""
        return self._pool(self.forward_tokens(pixel_values))

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.pool == "avg":
            return self.fc_norm(x[:, self.cfg.num_prefix_tokens:].mean(dim=1))
        if self.cfg.pool == "token_avg":
            return torch.cat([x[:, 0], x[:, self.cfg.num_prefix_tokens:].mean(dim=1)], dim=1)
        return self.fc_norm(x[:, 0])

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.forward_tokens(pixel_values)
        logits = self.head(self._pool(x))
        if self.head_dist is not None:  # DeiT at inference: the class and distillation heads averaged
            logits = (logits + self.head_dist(self.fc_norm(x[:, 1]))) / 2
        return logits


def resample_pos_embed(pos_embed: torch.Tensor, new_grid: int, num_prefix_tokens: int = 1,
                       antialias: bool = True) -> torch.Tensor:
    """Bicubically resample a (1, prefix + g*g, D) learned position table to a new grid (``antialias``:
    PyTorch's antialiased bicubic, as timm and transformers' DINOv2-with-registers use; plain bicubic
    otherwise, as transformers' DINOv2 does)."""
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    old_grid = int(math.isqrt(patches.shape[1]))
    if old_grid * old_grid != patches.shape[1]:
        raise ValueError(f"position table of {patches.shape[1]} patch tokens is not a square grid")
    if old_grid == new_grid:
        return pos_embed
    dim = patches.shape[-1]
    grid = patches.reshape(1, old_grid, old_grid, dim).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(new_grid, new_grid), mode="bicubic", align_corners=False, antialias=antialias)
    patches = grid.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, dim).to(pos_embed.dtype)
    return torch.cat([prefix, patches], dim=1)
