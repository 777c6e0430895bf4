"""A Vision Transformer written from the paper's four equations (Dosovitskiy et al., 2021).

    z0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos                (1)  patch + class + position
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                            (2)  pre-norm attention block
    z_l  = MLP(LN(z'_l)) + z'_l                                  (3)  pre-norm MLP block
    y    = LN(z_L^0)                                             (4)  class token -> head

Every size is a field of :class:`ViTConfig`; the named variants are data in ``VARIANTS`` (both defined,
torch-free, in ``vitdeploy/vit_schema.py``). So are the
close relatives people ship: prefix tokens (class, DeiT's distillation token, registers), average
pooling over the patch tokens (with ``fc_norm`` after the pool), SigLIP's attention pooling (``pool: map``),
layer scale (DeiT III, DINOv2), qk-norm, DINOv2 giant's SwiGLU MLP, EVA-02's rotary position embedding
(``model/rope.py``), norm inside the MLP and on the attention output, position tables with or without the prefix
positions (timm's ``no_embed_class``), and CLIP's image towers (a norm before the blocks, QuickGELU, a bias-free
projection after the pooling).
Parameter names are timm's, so a timm state dict loads as it is.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..base.vit_schema import VARIANTS, ViTConfig  # noqa: F401 - the one definition (torch-free), re-exported here
from ..base.vocab import ACTIVATIONS  # noqa: F401 - re-exported (GELU_APPROXIMATE has one entry per name)
from .rope import rope_table, rotate_patches

#: MLP activations: our name (vocab.ACTIVATIONS) -> torch.nn.functional.gelu's ``approximate`` argument
#: ("quick_gelu" is not a GELU of torch's: :func:`quick_gelu`).
GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """OpenAI CLIP's QuickGELU, ``x * sigmoid(1.702 x)``, as transformers, timm and open_clip compute it."""
    return x * torch.sigmoid(1.702 * x)


def sincos_position_embedding(grid: int, width: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding, (1, grid*grid, width)."""
    if width % 4:
        raise ValueError(f"sincos position embedding needs width divisible by 4, got {width}")
    ys, xs = torch.meshgrid(
        torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij"
    )
    omega = 1.0 / temperature ** (torch.arange(width // 4, dtype=torch.float32) / (width // 4 - 1 if width > 4 else 1))
    y = ys.flatten()[:, None] * omega[None, :]
    x = xs.flatten()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None]


class PatchEmbed(nn.Module):
    """Split the image into patches and project each with one strided convolution."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        # no bias before a norm over the tokens (CLIP: timm's bias=not pre_norm, transformers', open_clip's conv)
        self.proj = nn.Conv2d(
            cfg.in_channels, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size, bias=not cfg.norm_pre
        )

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
        self.prefix = cfg.num_prefix_tokens
        if cfg.attn_norm:  # EVA-CLIP's norm on the attention output (timm scale_attn_inner)
            self.norm = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # EVA-02: the patch tokens' queries and keys rotated by their grid position
            q, k = rotate_patches(q, rope, self.prefix), rotate_patches(k, rope, self.prefix)
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        return self.proj(self.norm(out) if hasattr(self, "norm") else out)


class Mlp(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)
        self.quick = cfg.act == "quick_gelu"
        self.approximate = GELU_APPROXIMATE.get(cfg.act, "none")
        self.norm = nn.LayerNorm(cfg.mlp_dim, eps=cfg.layer_norm_eps) if cfg.mlp_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # exact (erf) GELU as in the paper's reference code, the tanh form (timm gelu_tanh, HF gelu_pytorch_tanh),
        # or OpenAI CLIP's QuickGELU; EVA-02's norm over the hidden width before fc2
        h = self.fc1(x)
        return self.fc2(self.norm(quick_gelu(h) if self.quick else F.gelu(h, approximate=self.approximate)))


class SwiGLUMlp(nn.Module):
    """SwiGLU (Shazeer, 2020) as DINOv2's giant runs it: one fc1 writes both halves, SiLU gates the first and
    multiplies the second (timm ``SwiGLUPacked``, transformers ``Dinov2SwiGLUFFN`` ``weights_in``); EVA-02's
    (timm ``GluMlp``, or ``SwiGLU``'s fc1_g and fc1_x stacked into fc1) with its norm before fc2 (``mlp_norm``)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.fc1_dim)
        self.norm = nn.LayerNorm(cfg.mlp_dim, eps=cfg.layer_norm_eps) if cfg.mlp_norm else nn.Identity()
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(self.norm(F.silu(gate) * value))


#: ViTConfig.mlp -> the block's MLP module.
MLP_MODULES: dict[str, type[nn.Module]] = {"gelu": Mlp, "swiglu": SwiGLUMlp}


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.mlp = MLP_MODULES[cfg.mlp](cfg)
        if cfg.layer_scale:
            self.ls1, self.ls2 = LayerScale(cfg.width), LayerScale(cfg.width)
        else:
            self.ls1 = self.ls2 = nn.Identity()

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rope))  # (2)
        return x + self.ls2(self.mlp(self.norm2(x)))  # (3)


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (Touvron et al., 2021: CaiT / DeiT III)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class AttentionPool(nn.Module):
    """Attention pooling by a learned probe (``pool: map``), as timm's ``AttentionPoolLatent`` (SigLIP, with
    timm's names) and transformers' ``SiglipMultiheadAttentionPoolingHead`` compute it: the probe's query attends
    over the tokens (keys and values from one ``kv`` projection), ``proj``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.latent = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.q = nn.Linear(cfg.width, cfg.width)
        self.kv = nn.Linear(cfg.width, cfg.width * 2)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self.q(self.latent.expand(b, -1, -1)).reshape(b, 1, self.heads, d // self.heads).transpose(1, 2)
        k, v = self.kv(x).reshape(b, n, 2, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, 1, d))
        return (x + self.mlp(self.norm(x)))[:, 0]


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
            prefix = cfg.pos_len - cfg.pos_grid**2
            table = torch.cat(
                [torch.zeros(1, prefix, cfg.width), sincos_position_embedding(cfg.grid, cfg.width)], dim=1
            )
            self.register_buffer("pos_embed", table, persistent=False)
        norm = lambda: nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)  # noqa: E731
        self.norm_pre = norm() if cfg.norm_pre else nn.Identity()  # CLIP: every token normed before the blocks
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.Identity() if cfg.fc_norm else norm()
        self.fc_norm = norm() if cfg.fc_norm else nn.Identity()
        self.pooler = nn.Linear(cfg.width, cfg.width) if cfg.pooler else None  # transformers' ViTPooler (+ tanh)
        self.attn_pool = AttentionPool(cfg) if cfg.pool == "map" else None
        # CLIP's projection of the pooled features (no bias): the embedding
        self.proj = nn.Linear(cfg.features_width, cfg.proj_dim, bias=False) if cfg.proj_dim else None
        self.head = nn.Linear(cfg.pooled_width, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.head_dist = (
            (nn.Linear(cfg.width, cfg.num_classes) if cfg.num_classes else nn.Identity()) if cfg.distilled else None
        )
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
        latent = self.attn_pool.latent if self.attn_pool is not None else None
        for token in (self.cls_token, self.dist_token, self.reg_token, latent):
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward_tokens(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, prefix + patches, width): every token after the last block and ``norm``."""
        x = self.patch_embed(pixel_values)
        pos_embed = self._position_table(pixel_values) if self.cfg.dynamic_size else self.pos_embed
        prefix = [
            t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None
        ]
        if self.cfg.pos_embed_prefix:
            x = torch.cat([*prefix, x], dim=1) + pos_embed  # (1)
        else:  # the table covers the patches only; the prefix tokens carry no position
            x = torch.cat([*prefix, x + pos_embed], dim=1)
        x = self.norm_pre(x)
        rope = self._rope_table(pixel_values) if self.cfg.rope else None
        for block in self.blocks:
            x = block(x, rope)
        return self.norm(x)

    def _rope_table(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """EVA-02's rotary table at the input's grid (model/rope.py), on the input's device."""
        cfg = self.cfg
        h, w = (cfg.grid, cfg.grid)
        if cfg.dynamic_size:
            h, w = pixel_values.shape[-2] // cfg.patch_size, pixel_values.shape[-1] // cfg.patch_size
        return rope_table(h, w, cfg.width // cfg.heads, cfg.rope_grid).to(pixel_values.device)

    def _position_table(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The table at the input's grid, resampled as the checkpoint's library does (model/pos_resample.py)."""
        from .pos_resample import position_table

        cfg = self.cfg
        prefix = cfg.num_prefix_tokens if cfg.pos_embed_prefix else 0
        h, w = pixel_values.shape[-2] // cfg.patch_size, pixel_values.shape[-1] // cfg.patch_size
        return position_table(self.pos_embed, prefix, cfg.pos_grid, h, w, cfg.pos_resample == "bicubic_antialias")

    def forward_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, pooled_width): the class token (equation 4), the mean patch token (then
        fc_norm), or the two side by side; through the pooler (dense + tanh) where the checkpoint has one, and
        CLIP's projection where it has one."""
        return self._pool(self.forward_tokens(pixel_values))

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self._pool_tokens(x)
        if self.pooler is not None:
            pooled = torch.tanh(self.pooler(pooled))
        return self.proj(pooled) if self.proj is not None else pooled

    def _pool_tokens(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.pool == "avg":
            return self.fc_norm(x[:, self.cfg.num_prefix_tokens :].mean(dim=1))
        if self.cfg.pool == "token_avg":
            return torch.cat([x[:, 0], x[:, self.cfg.num_prefix_tokens :].mean(dim=1)], dim=1)
        if self.attn_pool is not None:  # "map": the probe attends over the patch tokens (timm: prefix left out)
            return self.fc_norm(self.attn_pool(x[:, self.cfg.num_prefix_tokens :]))
        return self.fc_norm(x[:, 0])

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.forward_tokens(pixel_values)
        pooled = self._pool(x)
        if self.cfg.head_l2norm:  # a zero-shot head: logit_scale x cosine with each class's text embedding (+ bias)
            pooled = l2_normalize(pooled)
        logits = self.head(pooled)
        if self.head_dist is not None:  # DeiT at inference: the class and distillation heads averaged
            logits = (logits + self.head_dist(self.fc_norm(x[:, 1]))) / 2
        return logits


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``F.normalize(x, dim=-1)``, written with ops ONNX Runtime's symbolic shape inference follows (the INT8
    pre-processing failed on every L2-normalised embedding: it gives ``ReduceL2`` no shape, and F.normalize's
    ``Expand`` of the norm then fails): the square root of a ``ReduceSum`` of squares, dividing by broadcasting."""
    return x / (x * x).sum(dim=-1, keepdim=True).sqrt().clamp_min(eps)


class EmbeddingNetwork(nn.Module):
    """What an embedding export runs: the ViT's pooled features (``forward_features``: the class token, the
    mean patch token, as its library pools them; no head), L2-normalised when ``normalize``. With
    ``patch_tokens`` it returns ``(pooled, patches)``: beside the vector, the image patches' tokens after the
    final norm, (B, num_patches, width), as the library gives them (transformers' ``last_hidden_state`` past
    the class token and registers, timm's ``forward_features`` past ``num_prefix_tokens``); never normalised."""

    def __init__(self, vit: VisionTransformer, normalize: bool = False, patch_tokens: bool = False) -> None:
        super().__init__()
        self.vit, self.normalize, self.patch_tokens = vit, normalize, patch_tokens

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        tokens = self.vit.forward_tokens(pixel_values)
        features = self.vit._pool(tokens)
        pooled = l2_normalize(features) if self.normalize else features
        if not self.patch_tokens:
            return pooled
        return pooled, tokens[:, self.vit.cfg.num_prefix_tokens :]


def output_network(vit: VisionTransformer, output: Any) -> nn.Module:
    """The network an export runs for ``output`` (base/output_spec.ModelOutput): the classifier itself, or
    its :class:`EmbeddingNetwork` (with the patch tokens as a second output when ``output.patch_tokens``)."""
    if not output.is_embedding:
        return vit
    return EmbeddingNetwork(vit, output.normalize, getattr(output, "patch_tokens", False)).eval()


def resample_pos_embed(
    pos_embed: torch.Tensor, new_grid: int, num_prefix_tokens: int = 1, antialias: bool = True
) -> torch.Tensor:
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
