"""timm ``vision_transformer`` and ``eva`` (EVA-02) state dicts: naming, architecture inference, hub config.

timm's parameter names are vitdeploy's own, so the key conversion is the identity; what a bare
state dict does not store (attention heads) is inferred, and the rest read from tensor shapes.
A timm hub directory (``config.json`` with ``architecture`` and ``pretrained_cfg``) also gives the
preprocessing and, when present, ``label_names``. timm's ``eva.py`` models (EVA-02) name the same computation
otherwise: ``convert_eva.py`` (:func:`convert_eva_state_dict` says how).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ....base.errors import CheckpointError
from ....base.preprocess_spec import (
    CLIP_MEAN,
    CLIP_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    INCEPTION_MEAN,
    INCEPTION_STD,
    PreprocessSpec,
)
from ....base.vocab import CROP_MODES, INTERPOLATIONS
from ...provenance import CHECKPOINT, LIBRARY, Preprocessing, describe_spec, override_hint
from ..shared import SIZE_BY_WIDTH, infer_config, variant_template
from .convert_eva import EVA01_ARCH, EVA01_GIANT_HEADS, convert_eva_state_dict, eva_default_preprocess, is_eva_state

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ...vit import ViTConfig

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: timm architectures of the vision_transformer family and of eva.py (EVA-02, EVA-01) (``config.json``
#: ``architecture``): what may load; anything else on timm's hub (convnets, Swin ...) is refused before its weights
#: are fetched (an eva.py model of another kind, by the timm reader: :func:`eva_architecture`)
TIMM_ARCH_PREFIXES = ("vit_", "deit_", "deit3_", "eva02_", "eva_")


#: timm's NaFlexViT (``naflexvit_*``, SigLIP 2 NaFlex among them): refused by name (``naflexvit_reason``)
TIMM_NAFLEX_PREFIX = "naflexvit_"


def naflexvit_reason(arch: str) -> str:
    return (
        f"architecture {arch!r} is timm's NaFlexViT: it takes each image at its own aspect ratio and patch count "
        "(a variable-length sequence of patches with their coordinates), which vitdeploy's fixed-size export does "
        "not run; timm's vit_*_siglip_* architectures (fixed resolution) load"
    )


def looks_like_timm(keys: set[str]) -> bool:
    return "patch_embed.proj.weight" in keys and any(k.startswith("blocks.") for k in keys)


def is_timm_config(config: dict[str, Any]) -> bool:
    return "architecture" in config and "model_type" not in config


def convert_timm_state_dict(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """timm -> vitdeploy naming: identical names, so a shallow copy (unknown keys stay, and strict loading reports
    them), except timm eva.py's (EVA-02: :func:`convert_eva_state_dict`) and a CLIP tower's projection, which timm
    keeps as ``head`` with an all-zero bias (its ``_convert_openai_clip``): our bias-free ``proj``
    (:func:`is_clip_projection`)."""
    out = convert_eva_state_dict(state) if is_eva_state(state) else dict(state)
    if is_clip_projection(out):
        out["proj.weight"] = out.pop("head.weight")
        del out["head.bias"]
    return out


def is_clip_projection(state: dict[str, Any]) -> bool:
    """A timm CLIP tower (``norm_pre``) whose ``head`` is CLIP's projection: its bias all zeros, as timm writes it
    for OpenCLIP / OpenAI weights (the tower's embedding). A trained classifier head's bias is never all zeros:
    that head stays a classifier (logits)."""
    bias = state.get("head.bias")
    return (
        "norm_pre.weight" in state
        and "head.weight" in state
        and bias is not None
        and bias.ndim == 1
        and not bool(bias.any())
    )


TIMM_KEYS = {
    "patch": "patch_embed.proj.weight",
    "pos": "pos_embed",
    "fc1": "blocks.0.mlp.fc1.weight",
    "qkv_bias": r"^blocks\.\d+\.attn\.qkv\.bias$",
    "head": "head.weight",
}


#: timm ``act_layer`` names -> ours (timm's GELUTanh is ``nn.GELU(approximate="tanh")``; QuickGELU: OpenAI CLIP's).
TIMM_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
#: what a timm architecture's name says of its MLP activation when model_args do not (the ``*_clip_quickgelu_*``
#: towers are built with act_layer='quick_gelu'; every other timm ViT runs GELU, the OpenAI CLIP weights included)
TIMM_ARCH_ACTS = {"_clip_quickgelu_": "quick_gelu"}
#: width -> heads of timm's vit_*_clip_* architectures (xsmall, medium, betwixt, base, base plus, large, huge, giant,
#: gigantic), which their names alone do not give
TIMM_CLIP_HEADS = {256: 4, 512: 8, 640: 10, 768: 12, 896: 14, 1024: 16, 1280: 16, 1408: 16, 1664: 16}
#: LayerNorm eps of timm's ViTs: 1e-6, but 1e-5 for every tower built with pre_norm (the CLIP towers)
TIMM_EPS, TIMM_CLIP_EPS = 1e-6, 1e-5
#: What timm's registration of an architecture sets beside its sizes, where config.json's model_args leave it out
#: (a hub config names the architecture; timm builds it with these): SigLIP's tanh-GELU towers and giantopt's heads.
TIMM_ARCH_ARGS: dict[str, dict[str, Any]] = {
    "vit_base_patch32_siglip_": {"act_layer": "gelu_tanh"},
    "vit_large_patch16_siglip_512": {"act_layer": "gelu_tanh"},
    "vit_large_patch16_siglip_gap_512": {"act_layer": "gelu_tanh"},
    "vit_so400m_patch16_siglip_": {"act_layer": "gelu_tanh"},
    "vit_giantopt_patch16_siglip_": {"act_layer": "gelu_tanh", "num_heads": 16},
}
#: timm ``act_layer`` names of a SwiGLUPacked MLP (its SiLU is built in; ``act`` stays "gelu", unused).
TIMM_SWIGLU_ACTS = ("silu", "swish")
# model_args that do not change the tensors' meaning for vitdeploy's ViT.
_HARMLESS_ARGS = {
    "num_heads",
    "act_layer",
    "global_pool",
    "img_size",
    "num_classes",
    "drop_rate",
    "pos_drop_rate",
    "attn_drop_rate",
    "proj_drop_rate",
    "drop_path_rate",
    "patch_size",
    "embed_dim",
    "depth",
    "mlp_ratio",
    "qkv_bias",
    "class_token",
    "dynamic_img_size",
    "dynamic_img_pad",
    "in_chans",
    "reg_tokens",
    "no_embed_class",
    "fc_norm",
    "init_values",
    "qk_norm",
    "mlp_layer",
}
#: timm global_pool values -> ours ("" / None: no pooling, refused; "max", "avgmax", "prr": refused); "map": the
#: attention pooling of timm's SigLIP (``attn_pool``, an ``AttentionPoolLatent``).
TIMM_POOLS = {"token": "token", "avg": "avg", "map": "map"}


def timm_vit_config(
    state: dict[str, "torch.Tensor"],
    where: Path,
    variant: str | None,
    hub_config: dict[str, Any] | None = None,
    *,
    num_heads: int | None = None,
    act: str | None = None,
    layer_norm_eps: float | None = None,
    pool: str | None = None,
    rope: dict[str, Any] | None = None,
) -> tuple["ViTConfig", str, tuple[str, ...]]:
    """(ViTConfig, heads origin, notes). ``num_heads`` / ``act`` / ``layer_norm_eps`` / ``pool``: what the
    caller knows (pipeline.yaml); checked against the hub config when it says otherwise. ``rope``: the rotary
    fields the architecture gives (an EVA: :func:`eva_family`)."""
    hub_config = hub_config or {}
    arch = str(hub_config.get("architecture") or "")
    registered = next((args for prefix, args in TIMM_ARCH_ARGS.items() if arch.startswith(prefix)), {})
    model_args = {**registered, **(hub_config.get("model_args") or {})}
    family, notes = timm_family(state, where, hub_config, pool)
    family.update(rope or {})
    hub_act = model_args.get("act_layer") or arch_act(hub_config)
    if family.get("mlp") == "swiglu" and (hub_act is None or hub_act in TIMM_SWIGLU_ACTS):
        hub_act = None  # SwiGLUPacked: SiLU, whatever act_layer says of a GELU MLP
    elif hub_act is not None and hub_act not in TIMM_ACTS:
        raise CheckpointError(
            f"{where}: model_args.act_layer {hub_act!r} is not supported; vitdeploy's ViT runs "
            f"{' or '.join(TIMM_ACTS)} (exporting anyway would change the outputs)"
        )
    if hub_act is not None and act is not None and TIMM_ACTS[hub_act] != act:
        raise CheckpointError(
            f"{where}: config.json says act_layer {hub_act!r} but model.activation is {act!r}; "
            "drop model.activation or fix config.json"
        )
    if family.get("norm_pre") and hub_act is None and act is None and not hub_config.get("architecture"):
        notes += (
            f"{where.name}: a CLIP tower without config.json: assumed GELU, as timm's vit_*_clip_* run it (OpenAI's "
            "weights run QuickGELU in timm's *_clip_quickgelu_*: set model.activation: quick_gelu)",
        )
    act = TIMM_ACTS[hub_act] if hub_act is not None else (act or "gelu")
    if layer_norm_eps is None:  # timm's ViT: LayerNorm(eps=1e-6); its CLIP towers (pre_norm): 1e-5
        layer_norm_eps = TIMM_CLIP_EPS if family.get("norm_pre") else TIMM_EPS
    eps = layer_norm_eps
    hub_heads = model_args.get("num_heads")
    if hub_heads is not None and num_heads is not None and int(hub_heads) != num_heads:
        raise CheckpointError(
            f"{where}: config.json says num_heads {hub_heads} but model.num_heads is {num_heads}; "
            "drop model.num_heads or fix config.json"
        )
    common = dict(
        prefix_keys=TIMM_KEYS,
        block_pattern=r"^blocks\.(\d+)\.",
        where=where,
        fmt="timm",
        act=act,
        layer_norm_eps=eps,
        family=family,
    )
    cfg, origin = _timm_heads(state, where, variant, hub_config, num_heads, hub_heads, common)
    return _off_grid_size(cfg, hub_config), origin, notes


def _off_grid_size(cfg: "ViTConfig", hub_config: dict[str, Any]) -> "ViTConfig":
    """The config at the input size timm builds the model for (``model_args.img_size``, else ``pretrained_cfg``
    ``input_size``) where that size is off the patch grid but gives the tensors' grid: timm's patch convolution
    then never reads the last rows and columns (``vit_so400m_patch14_siglip_384``: 384 px, a 27 x 27 grid)."""
    pcfg = hub_config.get("pretrained_cfg") or {}
    size = (hub_config.get("model_args") or {}).get("img_size") or (pcfg.get("input_size") or (None,))[-1]
    if isinstance(size, (list, tuple)):
        size = size[-1] if len(set(size)) == 1 else None
    if isinstance(size, int) and size % cfg.patch_size and size // cfg.patch_size == cfg.grid:
        return cfg.replace(image_size=size, drop_remainder=True)
    return cfg


def arch_act(hub_config: dict[str, Any]) -> str | None:
    """The activation config.json's ``architecture`` is built with (``TIMM_ARCH_ACTS``), or None."""
    arch = str(hub_config.get("architecture") or "")
    return next((act for part, act in TIMM_ARCH_ACTS.items() if part in arch), None)


def _timm_heads(
    state: dict[str, Any],
    where: Path,
    variant: str | None,
    hub_config: dict[str, Any],
    num_heads: int | None,
    hub_heads: Any,
    common: dict[str, Any],
) -> tuple["ViTConfig", str]:
    if num_heads is not None:
        return infer_config(
            state, variant=variant, heads=num_heads, heads_origin="pipeline.yaml: model.num_heads", **common
        )
    if hub_heads is not None:
        stated = "num_heads" in (hub_config.get("model_args") or {})  # else timm's registration of the architecture
        said = "model_args.num_heads" if stated else f"architecture {hub_config.get('architecture')}"
        return infer_config(
            state, variant=variant, heads=int(hub_heads), heads_origin=f"{CHECKPOINT}: config.json {said}", **common
        )
    if variant is None and hub_config.get("architecture"):
        arch = str(hub_config["architecture"])
        width = state.get(TIMM_KEYS["patch"])
        clip_heads = TIMM_CLIP_HEADS.get(int(width.shape[0])) if width is not None and "_clip_" in arch else None
        if clip_heads is not None:  # timm's CLIP towers: 64-wide heads but giant's and gigantic's
            origin = f"{CHECKPOINT}: config.json architecture {arch}"
            return infer_config(state, variant=None, heads=clip_heads, heads_origin=origin, **common)
        try:  # EVA-01's giant (1408 wide) is no standard size
            heads = EVA01_GIANT_HEADS if EVA01_ARCH.match(arch) else variant_template(arch).heads
        except CheckpointError as exc:
            logger.info("%s: architecture %r is not a known variant (%s)", where, arch, exc)
        else:  # timm builds the architecture with its own head count unless model_args say otherwise
            return infer_config(
                state,
                variant=None,
                heads=heads,
                heads_origin=f"{CHECKPOINT}: config.json architecture {arch}",
                **common,
            )
    width = state.get(TIMM_KEYS["patch"])
    width = int(width.shape[0]) if width is not None else 0
    if variant is None and common["family"].get("norm_pre") and width in TIMM_CLIP_HEADS:
        heads = TIMM_CLIP_HEADS[width]  # a bare CLIP tower: timm's heads for its width (giant's are 88 wide)
        origin = (
            f"library default (assumed): timm's CLIP tower of width {width} has {heads} heads; the checkpoint does "
            "not store it (set model.num_heads in pipeline.yaml if yours differs)"
        )
        return infer_config(state, variant=None, heads=heads, heads_origin=origin, **common)
    return infer_config(state, variant=variant, **common)


def timm_family(
    state: dict[str, Any], where: Path, hub_config: dict[str, Any], pool: str | None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The close-relative fields of a timm ViT (prefix tokens, pooling, fc_norm, layer scale, qk-norm, a
    SwiGLUPacked MLP) from its tensors, and its pooling from config.json (``global_pool``) or ``pool`` (pipeline.yaml
    model.pool); what had to be assumed comes back as notes."""
    args = hub_config.get("model_args") or {}
    if args.get("pool_include_prefix"):
        raise CheckpointError(
            f"{where}: model_args pool_include_prefix=True (pooling over the prefix tokens too) "
            "is not supported; vitdeploy averages the patch tokens only"
        )
    if pool is not None and pool not in TIMM_POOLS.values():
        raise CheckpointError(
            f"{where}: model.pool {pool!r} is not a timm pooling; a timm ViT pools the class token "
            "('token'), the mean of the patch tokens ('avg') or by attention ('map', SigLIP)"
        )
    reg = state.get("reg_token")
    family: dict[str, Any] = {
        "class_token": "cls_token" in state,
        "distilled": "dist_token" in state,
        "reg_tokens": int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0,
        "layer_scale": any(k.endswith(".ls1.gamma") for k in state),
        "qk_norm": any(k.endswith(".attn.q_norm.weight") for k in state),
        "fc_norm": "fc_norm.weight" in state,
        "mlp_norm": "blocks.0.mlp.norm.weight" in state,  # timm scale_mlp(_norm): EVA-02 B/L
        "attn_norm": "blocks.0.attn.norm.weight" in state,  # timm scale_attn_inner / scale_attn_norm: EVA-CLIP
        "norm_pre": "norm_pre.weight" in state,  # CLIP towers (pre_norm): the patch projection has no bias
    }
    proj = state.get("proj.weight")
    if proj is not None and proj.ndim == 2:  # CLIP's projection (convert_timm_state_dict: timm's zero-bias head)
        family["proj_dim"] = int(proj.shape[0])
    fc1, fc2 = state.get("blocks.0.mlp.fc1.weight"), state.get("blocks.0.mlp.fc2.weight")
    if fc1 is not None and fc2 is not None and fc1.ndim == fc2.ndim == 2 and fc1.shape[0] == 2 * fc2.shape[1]:
        family["mlp"] = "swiglu"  # fc1 writes twice what fc2 reads: timm's SwiGLUPacked (DINOv2 giant)
    if "no_embed_class" in args:
        family["pos_embed_prefix"] = not args["no_embed_class"]
    hub_pool = hub_config.get("global_pool", args.get("global_pool"))
    if hub_pool is not None and hub_pool not in TIMM_POOLS:
        raise CheckpointError(
            f"{where}: global_pool {hub_pool!r} is not supported; vitdeploy pools the class token "
            "('token'), the mean of the patch tokens ('avg') or by attention ('map', SigLIP)"
        )
    if "attn_pool.latent" in state:  # the tensors say it: an AttentionPoolLatent (SigLIP), whatever else is stated
        hub_pool = _attention_pool(state, where, hub_pool, pool)
    elif "map" in (hub_pool, pool):
        raise CheckpointError(
            f"{where}: {'config.json global_pool' if hub_pool == 'map' else 'model.pool'} is 'map' (attention "
            "pooling) but the checkpoint has no attention pool (attn_pool.latent, attn_pool.q, attn_pool.kv ...)"
        )
    if hub_pool is not None and pool is not None and TIMM_POOLS[hub_pool] != pool:
        raise CheckpointError(
            f"{where}: config.json says global_pool {hub_pool!r} but model.pool is {pool!r}; "
            "drop model.pool or fix config.json"
        )
    notes: tuple[str, ...] = ()
    if hub_pool is not None or pool is not None:
        family["pool"] = TIMM_POOLS[hub_pool] if hub_pool is not None else pool
    elif not family["class_token"] or family["fc_norm"]:
        family["pool"] = "avg"  # timm pairs fc_norm with global_pool='avg'; without a class token nothing else fits
        notes = (
            f"{where.name}: assumed average pooling (timm global_pool='avg'): the checkpoint has "
            f"{'fc_norm' if family['fc_norm'] else 'no class token'} and no config.json; set model.pool in "
            "pipeline.yaml if it was trained otherwise",
        )
    else:
        family["pool"] = "token"
        notes = (
            f"{where.name}: assumed class-token pooling: a timm ViT trained with global_pool='avg' and no "
            "fc_norm has the same tensors and no config.json says which; set model.pool: avg in pipeline.yaml "
            "if it was trained that way",
        )
    return family, notes


def _attention_pool(state: dict[str, Any], where: Path, hub_pool: str | None, pool: str | None) -> str:
    """'map' for a state dict with timm's ``attn_pool`` (one latent, a q projection, no qk-norm: SigLIP's);
    CheckpointError when config.json or model.pool says another pooling, or the pool is another shape."""
    latent = state["attn_pool.latent"]
    if latent.ndim != 3 or latent.shape[1] != 1 or "attn_pool.q.weight" not in state:
        raise CheckpointError(
            f"{where}: attn_pool with {tuple(latent.shape)} latents"
            f"{'' if 'attn_pool.q.weight' in state else ' and no q projection'} is not supported; vitdeploy runs "
            "SigLIP's attention pooling (one latent query, timm's AttentionPoolLatent defaults)"
        )
    if any(k.startswith(("attn_pool.q_norm.", "attn_pool.pos_embed")) for k in state):
        raise CheckpointError(
            f"{where}: attn_pool with qk-norm or a position table is not supported (SigLIP's has neither)"
        )
    for key, stated in (("config.json global_pool", hub_pool), ("model.pool", pool)):
        if stated not in (None, "map"):
            raise CheckpointError(
                f"{where}: the checkpoint has an attention pool (attn_pool.*) but {key} is {stated!r}; timm builds "
                "attn_pool for global_pool='map' only"
            )
    return "map"


def shorten_args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(args.items()) if k not in _HARMLESS_ARGS) or "{}"


def timm_arch_name(cfg: "ViTConfig", variant: str | None = None, hub_config: dict[str, Any] | None = None) -> str:
    """The timm architecture a checkpoint is taken for: config.json's, the named variant, or the
    standard name for its width, patch and image size (e.g. vit_tiny_patch16_224; with a distillation
    token deit_tiny_distilled_patch16_224)."""
    if hub_config and hub_config.get("architecture"):
        return str(hub_config["architecture"])
    if variant:
        return variant.split(".")[0]
    size = SIZE_BY_WIDTH.get(cfg.width, f"{cfg.width}wide")
    if cfg.mlp == "swiglu":  # SwiGLUPacked: timm's DINOv2 giant, the one timm ViT with that MLP
        return f"vit_{size}_patch{cfg.patch_size}_{f'reg{cfg.reg_tokens}_' if cfg.reg_tokens else ''}dinov2"
    if cfg.distilled:  # a distillation token and head: timm's distilled DeiT, its only ViT with one
        return f"deit_{size}_distilled_patch{cfg.patch_size}_{cfg.image_size}"
    if cfg.norm_pre:  # a norm before the blocks: timm's CLIP towers (QuickGELU: the *_clip_quickgelu_* ones)
        quick = "quickgelu_" if cfg.act == "quick_gelu" else ""
        return f"vit_{size}_patch{cfg.patch_size}_clip_{quick}{cfg.image_size}"
    if cfg.pool == "map":  # attention pooling: timm's SigLIP towers, its only ViTs with one
        return f"vit_{size}_patch{cfg.patch_size}_siglip_{cfg.image_size}"
    return f"vit_{size}_patch{cfg.patch_size}_{cfg.image_size}"


def timm_default_preprocess(arch: str, image_size: int) -> PreprocessSpec:
    """timm's default ``pretrained_cfg`` for a vision_transformer / deit architecture (timm 1.0):
    bicubic, centre crop, crop_pct 0.9 (1.0 from 384 px up, except SigLIP's ``*_siglip_*``, and for DINOv2's
    ``*_dinov2``), mean/std 0.5
    for ``vit_*`` and ImageNet's for ``deit_*``, ``*_dinov2`` and the DINO ``vit_small_patch8_224``; a CLIP tower
    (``*_clip_*``, whose pretrained tags differ) gets CLIP's own: OpenAI's mean / std, crop_pct 1.0."""
    if arch.startswith("eva"):
        return eva_default_preprocess(arch, image_size)
    dinov2 = arch.endswith("_dinov2")
    imagenet = arch.startswith("deit") or arch == "vit_small_patch8_224" or dinov2
    clip = "_clip_" in arch  # CLIP's own preprocessing: its mean / std, shortest side resized, centre crop
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if imagenet else (INCEPTION_MEAN, INCEPTION_STD)
    return PreprocessSpec(
        style="timm",
        height=image_size,
        width=image_size,
        crop_pct=1.0 if (image_size >= 384 and "_siglip_" not in arch) or dinov2 or clip else 0.9,
        interpolation="bicubic",
        crop_mode="center",
        mean=CLIP_MEAN if clip else mean,
        std=CLIP_STD if clip else std,
    )


def timm_preprocess(
    hub_config: dict[str, Any] | None, cfg: "ViTConfig", where: Path, variant: str | None = None
) -> Preprocessing:
    """Preprocessing from a timm hub config's ``pretrained_cfg`` (absent keys: timm's ``PretrainedCfg``
    defaults); without one, timm's default pretrained_cfg of the architecture, noted as an assumption."""
    pcfg = (hub_config or {}).get("pretrained_cfg")
    if not isinstance(pcfg, dict) or not pcfg:
        arch = timm_arch_name(cfg, variant, hub_config)
        spec = timm_default_preprocess(arch, cfg.image_size)
        origin = f"{LIBRARY}: timm pretrained_cfg of {arch}"
        note = (
            f"{where.name}: no preprocessing in the checkpoint; assumed timm's default for {arch} "
            f"({describe_spec(spec)}); {override_hint()}"
        )
        return Preprocessing.from_source(spec, origin, notes=(note,))
    crop_mode = pcfg.get("crop_mode") or "center"
    if crop_mode not in CROP_MODES:
        raise CheckpointError(f"{where}: pretrained_cfg crop_mode {crop_mode!r} is not one of {', '.join(CROP_MODES)}")
    interpolation = pcfg.get("interpolation") or "bicubic"
    if interpolation not in INTERPOLATIONS:
        raise CheckpointError(
            f"{where}: pretrained_cfg interpolation {interpolation!r} is not one of {INTERPOLATIONS}"
        )
    size = pcfg.get("input_size") or (3, cfg.image_size, cfg.image_size)
    try:
        spec = PreprocessSpec(
            style="timm",
            height=int(size[-2]),
            width=int(size[-1]),
            crop_pct=float(pcfg.get("crop_pct") or 0.875),
            interpolation=interpolation,
            crop_mode=crop_mode,
            mean=tuple(float(v) for v in (pcfg.get("mean") or IMAGENET_MEAN)),
            std=tuple(float(v) for v in (pcfg.get("std") or IMAGENET_STD)),
        )
    except (ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(f"{where}: unusable pretrained_cfg preprocessing: {exc}") from exc
    keys = {
        "crop_pct": "crop_pct",
        "interpolation": "interpolation",
        "crop_mode": "crop_mode",
        "mean": "mean",
        "std": "std",
        "height": "input_size",
        "width": "input_size",
    }
    defaults = {f: f"{LIBRARY}: timm PretrainedCfg" for f, k in keys.items() if not pcfg.get(k)}
    return Preprocessing.from_source(spec, f"{CHECKPOINT}: config.json pretrained_cfg", defaults)


def timm_labels(hub_config: dict[str, Any], num_classes: int, where: Path) -> tuple[str, ...] | None:
    names = hub_config.get("label_names")
    if not names:
        return None
    if len(names) != num_classes:
        raise CheckpointError(f"{where}: label_names has {len(names)} entries but the head has {num_classes} outputs")
    return tuple(str(n) for n in names)
