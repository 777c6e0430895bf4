"""The ViT architecture, defined once: :class:`ViTConfig`, its standard sizes and variants.

Torch-free, so every layer can use it: the network (``model/vit.py``) is built from it, the
checkpoint loaders check a model.json ``"vit"`` with it, and the runtime checks an export's
model.json against its manifest with it.

One class, two ways in:

* ``ViTConfig(width=..., ...)`` in Python: ``__post_init__`` refuses impossible values with a
  ``ValueError`` ("invalid ViT config: ...").
* :func:`validate_vit_config` for a file (model.json): pydantic reads the same class with the
  field types written on it, strictly ("768", 768.0, true and null are refused, not coerced;
  sizes below generous ceilings; unknown keys refused), then ``__post_init__`` runs the same
  checks, so no impossible config reaches a ZeroDivisionError or a multi-gigabyte allocation.
  The error names the file and the key.

Adding a field is adding one line to :class:`ViTConfig` (type, ceiling, default).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, TypeAdapter, ValidationError

from ._schema import FiniteFloat, NonNegativeInt, PositiveInt, format_validation_error
from .errors import VitDeployError
from .vocab import ACTIVATIONS, MLPS, POOLS, POS_RESAMPLES, Activation, MlpKind, Pool, PosResample

# Generous ceilings: ViT-22B has width 6144, depth 48; they stop hostile values, not real models.
MAX_WIDTH, MAX_DEPTH, MAX_SIDE, MAX_CLASSES = 65_536, 1_024, 16_384, 1_000_000
POS_EMBEDS: tuple[str, ...] = ("learned", "sincos")

#: Fields added after model.json's first readers, written only when they differ from these defaults.
_NEW_SWITCHES: dict[str, Any] = {
    "norm_pre": False,
    "proj_dim": 0,
    "rope": False,
    "rope_grid": 0,
    "mlp_norm": False,
    "attn_norm": False,
    "head_l2norm": False,
    "drop_remainder": False,
}

_SIZE_FIELDS = ("image_size", "patch_size", "in_channels", "width", "depth", "heads")


def family_problems(*, class_token: bool, distilled: bool, reg_tokens: int, pool: str, fc_norm: bool) -> list[str]:
    """What does not fit together among the prefix tokens and the pooling (empty when all is well)."""
    problems = []
    if pool in ("token", "token_avg") and not class_token:
        problems.append(f"pool {pool!r} needs class_token true")
    if pool == "token_avg" and fc_norm:
        problems.append("pool 'token_avg' has no fc_norm (the final norm is on every token, before the pooling)")
    if distilled and (not class_token or pool != "token" or reg_tokens):
        problems.append("distilled needs class_token true, pool 'token' and reg_tokens 0")
    return problems


def rope_problems(rope: bool, rope_grid: int, head_dim: int) -> list[str]:
    """What does not fit in the rotary position embedding's fields (empty when all is well)."""
    if rope and head_dim % 4:
        return [f"rope needs a head width divisible by 4 (two axes of sine-cosine pairs), got {head_dim}"]
    if rope_grid and not rope:
        return ["rope_grid (the grid the rotary positions are scaled to) needs rope true"]
    return []


def check_fit(*, width: int, heads: int, image: int, patch: int, names: tuple[str, str, str, str]) -> None:
    """ValueError unless width % heads == 0 and image % patch == 0 (names: the keys, for the message)."""
    if width % heads:
        raise ValueError(f"{names[0]} {width} is not divisible by {names[1]} {heads}")
    if image % patch:
        raise ValueError(f"{names[2]} {image} is not a multiple of {names[3]} {patch}")


@dataclass(frozen=True)
class ViTConfig:
    """Every size and switch of a ViT; the types are what a model.json may state (see the module doc)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # a file's unknown "vit" key is refused

    image_size: Annotated[PositiveInt, Field(le=MAX_SIDE)] = 224
    patch_size: Annotated[PositiveInt, Field(le=MAX_SIDE)] = 16
    in_channels: Annotated[PositiveInt, Field(le=64)] = 3
    width: Annotated[PositiveInt, Field(le=MAX_WIDTH)] = 768
    depth: Annotated[PositiveInt, Field(le=MAX_DEPTH)] = 12
    heads: Annotated[PositiveInt, Field(le=MAX_WIDTH)] = 12
    mlp_ratio: Annotated[FiniteFloat, Field(gt=0, le=64)] = 4.0
    qkv_bias: StrictBool = True
    layer_norm_eps: Annotated[FiniteFloat, Field(gt=0, lt=1)] = 1e-6
    num_classes: Annotated[NonNegativeInt, Field(le=MAX_CLASSES)] = 1000
    pos_embed: Literal[POS_EMBEDS] = "learned"  # type: ignore[valid-type]  # "sincos": fixed 2-D sinusoidal
    # MLP activation: "gelu" (exact, erf), "gelu_tanh" (tanh approximation), "quick_gelu" (x * sigmoid(1.702 x))
    act: Activation = "gelu"
    # "gelu": fc1 -> GELU (act) -> fc2; "swiglu": fc1 writes 2 x mlp_dim, SiLU(first half) * second half -> fc2
    # (DINOv2 giant; act is then unused and stays "gelu"); mlp_dim is the hidden width fc2 reads in both
    mlp: MlpKind = "gelu"
    class_token: StrictBool = True  # a learned class token first in the sequence
    distilled: StrictBool = False  # DeiT's distillation token after it, with its own head; the two heads averaged
    reg_tokens: Annotated[NonNegativeInt, Field(le=1024)] = 0  # register tokens after the class token, never pooled
    # "token": the class token; "avg": the mean of the patch tokens (prefix tokens left out); "token_avg": the
    # class token and the mean patch token side by side, a head over 2 x width (transformers' DINOv2 classifiers);
    # "map": a learned probe attends over the patch tokens, then a norm and an MLP with a residual (SigLIP; timm's
    # attn_pool.{latent, q, kv, proj, norm, mlp}), the heads and MLP width the blocks' own
    pool: Pool = "token"
    fc_norm: StrictBool = False  # the final LayerNorm after the pooling (timm fc_norm) instead of on every token
    layer_scale: StrictBool = False  # per-channel scales on each residual branch (timm ls1/ls2.gamma)
    qk_norm: StrictBool = False  # LayerNorm over each head's queries and keys before attention
    pos_embed_prefix: StrictBool = True  # position rows for the prefix tokens (False: timm no_embed_class)
    # transformers' ViTPooler (ViTModel, DeiTModel): the pooled class token through Linear(width, width) and tanh,
    # what the library returns as pooler_output (the backbone's embedding)
    pooler: StrictBool = False
    # the input may be any multiple of the patch: the position table, learned for ``pos_size`` (0: image_size),
    # is resampled to the input's grid at every call as the checkpoint's library does it (vocab.POS_RESAMPLES);
    # image_size is then the export's base size
    pos_resample: PosResample = "none"
    pos_size: Annotated[NonNegativeInt, Field(le=MAX_SIDE)] = 0
    # EVA-02 (timm eva.py): a 2-D rotary position embedding on the patch tokens' queries and keys in every block
    # (timm RotaryEmbeddingCat: interleaved pairs, row then column frequencies, temperature 10000), the positions
    # scaled to a ``rope_grid`` x ``rope_grid`` grid at every input size (timm ref_feat_shape; 0: the input's own)
    rope: StrictBool = False
    rope_grid: Annotated[NonNegativeInt, Field(le=MAX_SIDE)] = 0
    mlp_norm: StrictBool = False  # a LayerNorm over the MLP's hidden width before fc2 (timm scale_mlp: EVA-02 B/L)
    attn_norm: StrictBool = False  # a LayerNorm on the attention output before its projection (timm scale_attn_inner)
    # CLIP image towers: a LayerNorm over every token before the blocks (timm pre_norm, transformers pre_layrnorm,
    # open_clip ln_pre); the patch projection then has no bias, as in every library that has this norm
    norm_pre: StrictBool = False
    # CLIP's projection: a bias-free Linear(features, proj_dim) after the pooling (transformers visual_projection,
    # open_clip proj, timm's zero-bias head of a CLIP tower); the embedding (and a head, if any) reads its output
    proj_dim: Annotated[NonNegativeInt, Field(le=MAX_WIDTH)] = 0
    # the head reads the pooled embedding L2-normalised: a zero-shot classifier compiled from a contrastive model
    # (model/zero_shot.py), whose head holds logit_scale x the class text embeddings (+ SigLIP's logit_bias)
    head_l2norm: StrictBool = False
    # image_size need not be a multiple of patch_size: the strided patch convolution never reads the last
    # image_size % patch_size rows and columns, as timm and transformers run SigLIP so400m/14 at 384 px (grid 27)
    drop_remainder: StrictBool = False

    def __post_init__(self) -> None:
        sizes = {k: getattr(self, k) for k in _SIZE_FIELDS}
        bad = [f"{k} {v!r}" for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
        if bad:  # checked first: a zero or a string must not reach the arithmetic below
            raise ValueError(f"invalid ViT config: sizes must be positive integers, got {', '.join(bad)}")
        problems = []
        if self.image_size % self.patch_size and not self.drop_remainder:
            problems.append(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.width % self.heads:
            problems.append(f"width {self.width} is not divisible by heads {self.heads}")
        if self.act not in ACTIVATIONS:
            problems.append(f"act must be one of {', '.join(ACTIVATIONS)}, got {self.act!r}")
        if self.mlp not in MLPS:
            problems.append(f"mlp must be one of {', '.join(MLPS)}, got {self.mlp!r}")
        elif self.mlp == "swiglu" and self.act != "gelu":
            problems.append(f"act {self.act!r} is a GELU MLP's flavour; the swiglu MLP runs SiLU (leave act 'gelu')")
        if self.pos_embed not in POS_EMBEDS:
            problems.append(f"pos_embed must be 'learned' or 'sincos', got {self.pos_embed!r}")
        elif self.pos_embed == "sincos" and self.width % 4:
            problems.append(f"pos_embed 'sincos' needs width divisible by 4, got width {self.width}")
        if isinstance(self.reg_tokens, bool) or not isinstance(self.reg_tokens, int) or self.reg_tokens < 0:
            problems.append(f"reg_tokens must be an integer >= 0, got {self.reg_tokens!r}")
        if self.pool not in POOLS:
            problems.append(f"pool must be one of {', '.join(POOLS)}, got {self.pool!r}")
        else:
            problems += family_problems(
                class_token=self.class_token,
                distilled=self.distilled,
                reg_tokens=self.reg_tokens,
                pool=self.pool,
                fc_norm=self.fc_norm,
            )
        if self.pos_resample not in POS_RESAMPLES:
            problems.append(f"pos_resample must be one of {', '.join(POS_RESAMPLES)}, got {self.pos_resample!r}")
        elif self.pos_resample != "none" and self.pos_embed != "learned":
            problems.append("pos_resample needs a learned position table (pos_embed 'learned')")
        if self.pos_size % self.patch_size:
            problems.append(f"pos_size {self.pos_size} is not a multiple of patch_size {self.patch_size}")
        elif self.pos_size and self.pos_resample == "none":
            problems.append("pos_size (a table of another size than image_size) needs pos_resample")
        if self.num_classes < 0:
            problems.append(f"num_classes must be >= 0, got {self.num_classes}")
        problems += rope_problems(self.rope, self.rope_grid, self.width // self.heads)
        if self.proj_dim and self.distilled:
            problems.append("proj_dim (a projection after the pooling) does not go with distilled's second head")
        if self.head_l2norm and not self.num_classes:
            problems.append("head_l2norm (the embedding L2-normalised before the head) needs a head, num_classes > 0")
        if self.pool == "map" and (self.mlp != "gelu" or self.mlp_norm):
            problems.append("pool 'map' (attention pooling with a plain GELU MLP) needs mlp 'gelu' and no mlp_norm")
        if self.drop_remainder and self.image_size < self.patch_size:
            problems.append(f"image_size {self.image_size} is smaller than one patch ({self.patch_size})")
        if self.drop_remainder and self.dynamic_size:
            problems.append("drop_remainder (a fixed input size off the patch grid) cannot go with pos_resample")
        if self.pooler and self.pool != "token":
            problems.append(f"pooler (dense + tanh on the class token) needs pool 'token', got {self.pool!r}")
        if problems:
            raise ValueError("invalid ViT config: " + "; ".join(problems))

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid

    @property
    def pos_grid(self) -> int:
        """Side of the position table's grid: the grid it was learned for (``pos_size``), or the input's."""
        return (self.pos_size or self.image_size) // self.patch_size

    @property
    def dynamic_size(self) -> bool:
        """The network runs at any multiple of the patch (the table follows the input, ``pos_resample``)."""
        return self.pos_resample != "none"

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class, distillation, registers."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def pos_len(self) -> int:
        """Rows of the position table."""
        return self.pos_grid**2 + (self.num_prefix_tokens if self.pos_embed_prefix else 0)

    @property
    def mlp_dim(self) -> int:
        """The MLP's hidden width: what fc2 reads (SwiGLU: the gated half of fc1's output)."""
        return int(round(self.width * self.mlp_ratio))

    @property
    def fc1_dim(self) -> int:
        """fc1's output width: ``mlp_dim``, or twice that for SwiGLU (the SiLU half, then the linear half)."""
        return 2 * self.mlp_dim if self.mlp == "swiglu" else self.mlp_dim

    @property
    def features_width(self) -> int:
        """Values the pooling gives: ``width``, or twice that for ``token_avg``."""
        return 2 * self.width if self.pool == "token_avg" else self.width

    @property
    def pooled_width(self) -> int:
        """Features the head reads (an embedding's dimension): the projection's ``proj_dim``, else
        ``features_width``."""
        return self.proj_dim or self.features_width

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
        elif self.pool == "map":
            parts.append("attention pooling (SigLIP MAP head)" + (" + fc_norm" if self.fc_norm else ""))
        elif self.pool != "token":
            parts.append("average pooling" + (" + fc_norm" if self.fc_norm else ""))
        elif self.fc_norm:
            parts.append("fc_norm")
        parts += [
            name
            for name, on in (
                ("SwiGLU MLP", self.mlp == "swiglu"),
                ("layer scale", self.layer_scale),
                ("qk-norm", self.qk_norm),
                ("no prefix positions", not self.pos_embed_prefix),
                ("2-D rotary position embedding" + (f" (grid {self.rope_grid})" if self.rope_grid else ""), self.rope),
                ("norm inside the MLP", self.mlp_norm),
                ("norm on the attention output", self.attn_norm),
                ("norm before the blocks (CLIP)", self.norm_pre),
                (f"projection to {self.proj_dim}", self.proj_dim),
                ("QuickGELU", self.act == "quick_gelu"),
                ("zero-shot head on the L2-normalised embedding", self.head_l2norm),
            )
            if on
        ]
        if self.drop_remainder:
            parts.append(
                f"image {self.image_size} off the {self.patch_size} px patch grid: its last "
                f"{self.image_size % self.patch_size} rows and columns never read"
            )
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.dynamic_size:  # a fixed-size model's model.json stays as before (older readers refuse new keys)
            data.pop("pos_resample"), data.pop("pos_size")
        for key, default in _NEW_SWITCHES.items():  # absent when off: other models' model.json stays as before
            if data[key] == default:
                del data[key]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ViTConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ViT config keys {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**data)

    def replace(self, **changes: Any) -> "ViTConfig":
        return replace(self, **changes)


#: Deprecated alias (one release): the schema of model.json "vit" is ViTConfig itself now.
ViTFields = ViTConfig


# The standard sizes, once: the paper's Table 1 (B/L/H) plus DeiT's Ti/S, DINOv2's giant and SigLIP's so400m ->
# (width, depth, heads, mlp dim); giant's MLP is SwiGLU (mlp dim: the gated hidden width, fc1 writes twice that).
VIT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (192, 12, 3, 768),
    "small": (384, 12, 6, 1536),
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
    "huge": (1280, 32, 16, 5120),
    "giant": (1536, 40, 24, 4096),
    "so400m": (1152, 27, 16, 4304),  # SigLIP's shape-optimised 400M tower (timm vit_so400m_patch14_siglip_*)
}
#: width -> heads / size name of the standard sizes (any other width needs model.num_heads).
HEADS_BY_WIDTH: dict[int, int] = {width: heads for width, _, heads, _ in VIT_SIZES.values()}
SIZE_BY_WIDTH: dict[int, str] = {dims[0]: size for size, dims in VIT_SIZES.items()}
#: The sizes whose MLP is SwiGLU (DINOv2's giant), and the one patch size each size is named with.
SWIGLU_SIZES: tuple[str, ...] = ("giant",)
_ONE_PATCH = {"huge": 14, "giant": 14, "so400m": 14}


def dinov2_swiglu_hidden(width: int, mlp_ratio: float) -> int:
    """The SwiGLU hidden width DINOv2 derives from a GELU MLP's ratio (its ``SwiGLUFFNFused``, transformers'
    ``Dinov2SwiGLUFFN``): two thirds of ``int(width * mlp_ratio)``, rounded up to a multiple of 8 (4096 for
    width 1536, ratio 4)."""
    return (int(int(width * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def _variant(size: str, patch: int) -> ViTConfig:
    width, depth, heads, mlp = VIT_SIZES[size]
    kind = "swiglu" if size in SWIGLU_SIZES else "gelu"
    return ViTConfig(patch_size=patch, width=width, depth=depth, heads=heads, mlp_ratio=mlp / width, mlp=kind)


#: The named variants at 224, patch 16 and 32 (huge: 14): ``vit_base_patch16_224`` ...; giant as DINOv2's
#: (timm's name, ``vit_giant_patch14_dinov2``: timm's ``vit_giant_patch14_224`` is another, GELU, model).
VARIANTS: dict[str, ViTConfig] = {
    **{
        f"vit_{size}_patch{patch}_224": _variant(size, patch)
        for size in VIT_SIZES
        if size not in SWIGLU_SIZES
        for patch in ((_ONE_PATCH[size],) if size in _ONE_PATCH else (16, 32))
    },
    **{f"vit_{size}_patch{_ONE_PATCH[size]}_dinov2": _variant(size, _ONE_PATCH[size]) for size in SWIGLU_SIZES},
}


_ADAPTER: TypeAdapter[ViTConfig] = TypeAdapter(ViTConfig)


def parse_vit_config(
    data: Any, path: Path | str, *, key_prefix: str = "", error: type[VitDeployError] = VitDeployError
) -> ViTConfig:
    """``data`` (a file's "vit" object) read strictly into a ViTConfig; ``error`` naming ``path`` and the key
    otherwise."""
    if not isinstance(data, dict):
        raise error(f"{path}: '{key_prefix or 'vit'}' must be an object of ViT sizes, got {type(data).__name__}")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        prefix = (key_prefix,) if key_prefix else ()
        raise error(format_validation_error(exc, str(path), prefix=prefix)) from None


def validate_vit_config(
    data: Any, path: Path | str, *, key_prefix: str = "", error: type[VitDeployError] = VitDeployError
) -> dict[str, Any]:
    """:func:`parse_vit_config` as a dict of every field (what the manifest checks read)."""
    return parse_vit_config(data, path, key_prefix=key_prefix, error=error).to_dict()
