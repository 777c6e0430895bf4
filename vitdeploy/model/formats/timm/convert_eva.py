"""timm ``eva.py`` (EVA-02, EVA-01) state dicts: what the timm format adds for them (``convert.py`` calls these).

EVA keeps what vitdeploy's ViT computes under other names: separate q_proj / k_proj / v_proj (EVA-02 B/L) or one
qkv with q_bias and v_bias (Ti/S, EVA-01) -> one qkv whose key bias is zero (timm's own is a buffer of zeros);
SwiGLU's separate gate and value layers (fc1_g, fc1_x) -> one fc1 writing the gate then the value (GluMlp's
packed fc1 is that already); gamma_1 / gamma_2 -> ls1.gamma / ls2.gamma. mlp.norm (scale_mlp) and attn.norm
(EVA-CLIP's scale_attn_inner) keep their names. No tensor says whether the blocks rotate their queries and keys
(every EVA-02 does, scaled to a 16 x 16 grid: ref_feat_shape): the architecture says it (config.json, or
model.variant for a bare state dict), and the model_args a hub config states are checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ....base.errors import CheckpointError
from ....base.preprocess_spec import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, PreprocessSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: timm's EVA-02 architectures: ``eva02_<size>_patch<p>_<img>[_clip]`` (all of them rotary, ref_feat_shape 16).
EVA02_ARCH = re.compile(r"^eva02_(tiny|small|base|large)_patch(\d+)_(?:clip_)?(\d+)$")
#: timm's EVA-01 architectures of the Eva class (no rotary embedding)
EVA01_ARCH = re.compile(r"^eva_giant_patch14_(?:clip_)?\d+$")
EVA01_GIANT_HEADS = 16  # timm's eva_giant_patch14_*: width 1408, 16 heads
EVA02_ROPE_GRID = 16  # every EVA-02 architecture's ref_feat_shape (224 / 14)
#: EVA architectures whose default pretrained_cfg squashes (crop_mode 'squash', crop_pct 1.0)
SQUASH_ARCHS = (
    *("eva02_base_patch14_448", "eva02_large_patch14_448", "eva_large_patch14_336"),
    *("eva_giant_patch14_336", "eva_giant_patch14_560"),
)

#: model_args of timm's Eva whose value must be the one vitdeploy computes (another is refused by name)
EVA_FIXED_ARGS: dict[str, Any] = {
    **{"rope_type": "cat", "rope_temperature": 10000.0, "rope_grid_offset": 0.0, "rope_grid_indexing": "ij"},
    **{"rope_rotate_half": False, "attn_type": "eva", "use_post_norm": False, "use_pre_transformer_norm": False},
    **{"gated_attn": False, "num_kv_heads": None, "attn_only_layer_scale": False, "swiglu_align_to": 0},
    **{"dynamic_img_pad": False, "attn_head_dim": None, "use_abs_pos_emb": True},
}


def is_eva_state(keys: Any) -> bool:
    """timm Eva's tensor names: q/v biases beside a packed qkv, separate q/k/v, separate SwiGLU layers, gamma_N."""
    return any(
        re.match(r"^blocks\.\d+\.(attn\.(q_bias|q_proj\.weight)|mlp\.fc1_g\.weight|gamma_[12])$", k) for k in keys
    )


def convert_eva_state_dict(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """timm Eva -> vitdeploy naming (the comment above this section); the rotary tables (never persistent) dropped."""
    import torch

    out = {k: v for k, v in state.items() if not k.startswith("rope.")}
    blocks = sorted({int(m.group(1)) for k in out if (m := re.match(r"^blocks\.(\d+)\.", k))})
    for i in blocks:
        p = f"blocks.{i}."
        if f"{p}attn.q_proj.weight" in out:
            parts = [out.pop(f"{p}attn.{n}_proj.weight") for n in "qkv"]
            out[f"{p}attn.qkv.weight"] = torch.cat(parts)
            q_bias, v_bias = out.pop(f"{p}attn.q_proj.bias", None), out.pop(f"{p}attn.v_proj.bias", None)
        else:
            q_bias, v_bias = out.pop(f"{p}attn.q_bias", None), out.pop(f"{p}attn.v_bias", None)
        if q_bias is not None and v_bias is not None:
            out[f"{p}attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), v_bias])
        for kind in ("weight", "bias"):
            if f"{p}mlp.fc1_g.{kind}" in out:
                gate, value = out.pop(f"{p}mlp.fc1_g.{kind}"), out.pop(f"{p}mlp.fc1_x.{kind}")
                out[f"{p}mlp.fc1.{kind}"] = torch.cat([gate, value])
        for n in (1, 2):
            if f"{p}gamma_{n}" in out:
                out[f"{p}ls{n}.gamma"] = out.pop(f"{p}gamma_{n}")
    return out


def eva_architecture(hub_config: dict[str, Any] | None, variant: str | None, where: Path) -> str:
    """The timm architecture of an Eva state dict: config.json's or ``model.variant``'s; CheckpointError when
    neither says, or when it is an Eva of timm's other than EVA-02 / EVA-01 (other rotary schemes)."""
    arch = str((hub_config or {}).get("architecture") or (variant or "").split(".")[0]).strip().lower()
    if not arch:
        raise CheckpointError(
            f"{where}: a timm EVA state dict (q/v biases, separate SwiGLU layers) does not say whether its "
            "attention is rotary; set model.variant to its timm architecture (e.g. eva02_base_patch14_224) "
            "or load the timm hub folder (config.json)"
        )
    if arch.startswith("eva02_enormous"):
        raise CheckpointError(
            f"{where}: timm architecture {arch!r} has post-norm blocks (timm use_post_norm: a norm after each "
            "residual branch), which vitdeploy's pre-norm ViT does not run"
        )
    if not (EVA02_ARCH.match(arch) or EVA01_ARCH.match(arch)):
        raise CheckpointError(
            f"{where}: timm architecture {arch!r} (timm eva.py) is not supported; vitdeploy runs timm's "
            "EVA-02 (eva02_{tiny,small,base,large}_*) and EVA-01 giants, not other rotary schemes"
        )
    return arch


def eva_family(arch: str, hub_config: dict[str, Any] | None, where: Path) -> dict[str, Any]:
    """The rotary fields of ``arch`` (with what config.json's model_args change), checked against what
    vitdeploy computes."""
    args = dict((hub_config or {}).get("model_args") or {})
    for key, want in EVA_FIXED_ARGS.items():
        if key in args and args[key] != want:
            raise CheckpointError(
                f"{where}: model_args {key}={args[key]!r} is not supported for {arch}; vitdeploy's EVA runs "
                f"{key}={want!r} (exporting anyway would change the outputs)"
            )
    rope = bool(args.get("use_rot_pos_emb", EVA02_ARCH.match(arch) is not None))
    if not rope:
        return {"rope": False}
    ref = args.get("ref_feat_shape", EVA02_ROPE_GRID if EVA02_ARCH.match(arch) else None)
    if isinstance(ref, (list, tuple)):
        if len(ref) != 2 or ref[0] != ref[1]:
            raise CheckpointError(f"{where}: model_args ref_feat_shape {ref!r} is not square; vitdeploy needs h == w")
        ref = ref[0]
    return {"rope": True, "rope_grid": int(ref or 0)}


def eva_default_preprocess(arch: str, image_size: int) -> PreprocessSpec:
    """timm's default pretrained_cfg of an EVA architecture (timm 1.0): OpenAI CLIP's mean/std, bicubic, crop_pct
    0.9 below 336 px and 1.0 from there, squashed for EVA-02 B/L at 448 (EVA-01 giant at 560: ImageNet's)."""
    squash, imagenet = arch in SQUASH_ARCHS, arch == "eva_giant_patch14_560"
    return PreprocessSpec(
        style="timm",
        height=image_size,
        width=image_size,
        crop_pct=1.0 if image_size >= 336 or squash or arch.startswith("eva_large") else 0.9,
        interpolation="bicubic",
        crop_mode="squash" if squash else "center",
        mean=IMAGENET_MEAN if imagenet else CLIP_MEAN,
        std=IMAGENET_STD if imagenet else CLIP_STD,
    )
