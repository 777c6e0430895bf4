"""Hugging Face ``ViTForImageClassification`` / ``ViTModel``, DeiT (``DeiTForImageClassification``,
``DeiTForImageClassificationWithTeacher``, ``DeiTModel``) and DINOv2 (``Dinov2ForImageClassification``,
``Dinov2WithRegistersForImageClassification`` and their ``...Model``) -> vitdeploy naming, config and
preprocessing.

DeiT is a ViT with a second prefix token. ``...WithTeacher`` reads it with its own head and averages
the two heads' logits: our ``distilled`` ViT (``distillation_token`` -> ``dist_token``,
``cls_classifier`` / ``distillation_classifier`` -> ``head`` / ``head_dist``). The other DeiT classes
carry the token but never read it: to our ViT it is one register token (``reg_token``).

Two key namings exist and both are accepted:

* the hub (and ``save_pretrained``, which transformers 5.x still writes) naming:
  ``vit.encoder.layer.N.attention.attention.query`` ... ``intermediate.dense``, ``output.dense``;
* the in-memory naming of transformers 5.x modules (``model.state_dict()``):
  ``vit.layers.N.attention.q_proj`` ... ``mlp.fc1``, ``mlp.fc2``.

``ViTModel`` checkpoints have no ``vit.`` prefix; their ``pooler.*`` weights are not part of the
classifier path and are dropped. Separate q/k/v projections are concatenated into ``attn.qkv``.

DINOv2 is a ViT with layer scale (``layer_scale1.lambda1`` -> ``ls1.gamma``) whose classifier reads the
class token and the mean patch token side by side (pool ``token_avg``, a head over 2 x width); its
``mask_token`` is read only in pre-training (``bool_masked_pos``) and is dropped. DINOv2 giant's SwiGLU MLP
(``use_swiglu_ffn``) is our ``mlp: swiglu``: the hub's ``mlp.weights_in`` is our ``fc1`` as it stands
(``SiLU(first half) * second half``), transformers 5.x's in-memory ``gate_proj`` / ``up_proj`` are concatenated
back into it, ``weights_out`` / ``down_proj`` is ``fc2``; the hidden width is DINOv2's two thirds of
``int(hidden_size * mlp_ratio)`` rounded up to a multiple of 8. With registers, the
position table covers the class token and the patches but not the registers, which transformers
inserts after adding it: the class row is added to ``cls_token`` once here (the same float32 sum
transformers computes at every call, so exact) and the table keeps the patch rows, which is timm's
``no_embed_class`` layout (``pos_embed_prefix: false``) and how timm itself converts these checkpoints.
transformers resamples a DINOv2 position table to the input size at every call (bicubic; with
antialiasing for the registers model only): when the processor's crop differs from ``image_size``
(the hub models: 518 in config.json, 224 from the processor), the table is resampled once, the same way.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ....base._deps import require
from ....base.errors import CheckpointError
from ....base.preprocess_spec import PreprocessSpec
from ....base.vit_schema import dinov2_swiglu_hidden
from ...provenance import CHECKPOINT, LIBRARY, Preprocessing
from . import convert_siglip as siglip
from .convert_clip import (
    CLIP_DEFAULTS,
    CLIP_DROPPED,
    CLIP_LAYER,
    CLIP_MODEL_TYPES,
    CLIP_TOP,
    clip_family,
    clip_shapes,
    vision_meta,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ...vit import ViTConfig

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: Which weights a folder's (or a Hub repo's) are, first found first: safetensors, whole or sharded, before a
#: pickle (read with torch.load(weights_only=True) only), as transformers prefers them.
WEIGHTS_PREFERENCE = (WEIGHT_FILES[0], INDEX_FILES[0], WEIGHT_FILES[1], INDEX_FILES[1])

_TOP = {
    "embeddings.cls_token": "cls_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
    "cls_classifier.weight": "head.weight",
    "cls_classifier.bias": "head.bias",
    "distillation_classifier.weight": "head_dist.weight",
    "distillation_classifier.bias": "head_dist.bias",
    "embeddings.register_tokens": "reg_token",
    "pooler.dense.weight": "pooler.weight",  # ViTModel / DeiTModel: pooler_output = tanh(dense(class token))
    "pooler.dense.bias": "pooler.bias",
    **CLIP_TOP,
    **siglip.TOP,  # SigLIP's tower (formats/hf/convert_siglip.py)
}
#: Model types whose checkpoints load, and the prefix of their backbone's keys (CLIP's image tower: ``clip.py``).
MODEL_TYPES = {
    "vit": "vit.",
    "deit": "deit.",
    "dinov2": "dinov2.",
    "dinov2_with_registers": "dinov2_with_registers.",
    **CLIP_MODEL_TYPES,
    **{model_type: siglip.PREFIX for model_type in siglip.SIGLIP_TYPES},
}
#: DINOv2 model types -> whether transformers antialiases when it resamples the position table to the input size.
DINOV2_RESAMPLE_ANTIALIAS = {"dinov2": False, "dinov2_with_registers": True}
# What transformers' configuration classes default to where they differ from ViTConfig's.
_DEFAULTS = {
    "dinov2": {"patch_size": 14, "layer_norm_eps": 1e-6},
    "dinov2_with_registers": {"layer_norm_eps": 1e-6},
    "clip_vision_model": CLIP_DEFAULTS,
}
# Tensors of pre-training only, never read by a classifier: dropped (the pooler too, beside a classifier head:
# transformers' classifiers read the class token, never pooler_output).
_DROPPED = ("embeddings.mask_token", *CLIP_DROPPED, *siglip.DROPPED)
# Per-layer module names, both namings -> ours ("q"/"k"/"v" are gathered into qkv).
_LAYER = {
    "layernorm_before": "norm1",
    "norm1": "norm1",
    "layernorm_after": "norm2",
    "norm2": "norm2",
    "layer_scale1": "ls1",
    "layer_scale2": "ls2",
    "attention.attention.query": "q",
    "attention.q_proj": "q",
    "attention.attention.key": "k",
    "attention.k_proj": "k",
    "attention.attention.value": "v",
    "attention.v_proj": "v",
    "attention.output.dense": "attn.proj",
    "attention.o_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "mlp.fc1": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "mlp.fc2": "mlp.fc2",
    # DINOv2's SwiGLU (use_swiglu_ffn): weights_in is fc1 as it stands (the SiLU half first); transformers 5.x
    # splits it into gate_proj / up_proj in memory, gathered back here ("gate"/"up" -> fc1)
    "mlp.weights_in": "mlp.fc1",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.weights_out": "mlp.fc2",
    "mlp.down_proj": "mlp.fc2",
    **CLIP_LAYER,  # SigLIP's layers have CLIP's names
}
#: Per-layer pieces gathered into one of our tensors (concatenated in this order along the output rows).
_GATHERED = {"attn.qkv": ("q", "k", "v"), "mlp.fc1": ("gate", "up")}
_PIECE = {piece: target for target, pieces in _GATHERED.items() for piece in pieces}
_LAYER_RE = re.compile(r"^(?:encoder\.layers?|layers)\.(\d+)\.(.+)\.(weight|bias|lambda1)$")
_PARAM = {"weight": "weight", "bias": "bias", "lambda1": "gamma"}

# transformers' hidden_act -> ours: "gelu" is erf; the others are the tanh approximation (same formula).
HF_ACTS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "quick_gelu": "quick_gelu",  # CLIP's x * sigmoid(1.702 x)
}
# Processors whose int ``size`` means the shortest edge (their class sets default_to_square = False);
# every other processor (ViT, DeiT, BEiT ...) reads an int as a square (height = width = size).
_INT_SIZE_IS_SHORTEST_EDGE = {
    "CLIPImageProcessor",
    "BitImageProcessor",
    "ChineseCLIPImageProcessor",
    "SiglipImageProcessor",
}
# Class default of ``resample`` where it is not bilinear (used when the JSON leaves it out).
_DEFAULT_RESAMPLE = {
    "DeiTImageProcessor": 3,
    "CLIPImageProcessor": 3,
    "BitImageProcessor": 3,
    "ChineseCLIPImageProcessor": 3,
    "SiglipImageProcessor": 3,
}

# PIL resampling codes as stored in preprocessor_config.json.
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def is_hf_config(config: dict[str, Any]) -> bool:
    return "model_type" in config or "architectures" in config


def convert_hf_state_dict(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """HF ViT / DeiT / DINOv2 state dict (either naming) -> vitdeploy naming. Unknown keys pass through
    unchanged so that strict loading reports them; ``embeddings.mask_token`` is dropped, and ``pooler.*`` beside a
    classifier head; with registers, the class position row goes into ``cls_token`` (module docstring)."""
    torch = require("torch", "converting Hugging Face checkpoints")
    out: dict[str, Any] = {}
    gathered: dict[tuple[int, str, str], dict[str, tuple[str, Any]]] = {}
    teacher = any(k.startswith("distillation_classifier.") for k in state)
    registers = False
    for key, value in state.items():
        name = next((key[len(p) :] for p in MODEL_TYPES.values() if key.startswith(p)), key)
        if name == "embeddings.distillation_token":  # read by a head (WithTeacher) or by nothing
            out["dist_token" if teacher else "reg_token"] = value
            continue
        if name.startswith(_DROPPED):
            logger.debug("dropping %s (not used for classification)", key)
            continue
        if name in _TOP:
            out[_TOP[name]] = value
            registers = registers or name == "embeddings.register_tokens"
            continue
        m = _LAYER_RE.match(name)
        target = _LAYER.get(m.group(2)) if m else None
        if target is None:
            out[key] = value  # unknown: reported by the strict load under its own name
        elif target in _PIECE:
            gathered.setdefault((int(m.group(1)), _PIECE[target], m.group(3)), {})[target] = (key, value)
        else:
            out[f"blocks.{m.group(1)}.{target}.{_PARAM[m.group(3)]}"] = value
    for (layer, target, kind), parts in gathered.items():
        order = _GATHERED[target]
        if set(parts) == set(order):
            out[f"blocks.{layer}.{target}.{kind}"] = torch.cat([parts[p][1] for p in order], dim=0)
        else:  # incomplete: leave the pieces, strict loading names them and the missing qkv / fc1
            out.update({src: val for src, val in parts.values()})
    clip_shapes(out)
    if registers:
        _fold_class_position(out)
    siglip.finish_state(out)
    if "head.weight" in out:
        for name in ("pooler.weight", "pooler.bias"):
            out.pop(name, None)
    return out


def _fold_class_position(out: dict[str, Any]) -> None:
    """DINOv2 with registers: the class row of the position table into ``cls_token``; the table keeps the
    patch rows (registers get no position: transformers inserts them after the addition)."""
    reg, cls, pos = out.get("reg_token"), out.get("cls_token"), out.get("pos_embed")
    if reg is not None and reg.ndim == 3 and reg.shape[1] == 0:
        del out["reg_token"]  # num_register_tokens 0: plain DINOv2
        return
    if cls is None or pos is None or pos.ndim != 3 or cls.shape[-1] != pos.shape[-1]:
        return  # incomplete: strict loading names what is missing
    out["cls_token"] = cls + pos[:, :1]
    out["pos_embed"] = pos[:, 1:]


def _square(value: Any, what: str, where: Path) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise CheckpointError(f"{where}: {what} {value} is not square; only square ViTs are supported")
        value = value[0]
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"{where}: {what} must be a positive integer, got {value!r}")
    return value


def hf_vit_config(
    config: dict[str, Any], num_classes: int, where: Path, state: dict[str, Any] | None = None
) -> "ViTConfig":
    """ViTConfig from a HF config.json (HF's ViTConfig defaults for absent keys); ``state``: the
    converted tensors, whose prefix tokens (DeiT's distillation token) the config does not state."""
    from ...vit import ViTConfig

    siglip.refuse_naflex(config, where)
    if siglip.is_siglip(config):  # the image tower's own config, flat, with transformers' defaults
        config = siglip.vision_config(config, where)
    config = vision_meta(config)  # a CLIPModel: its vision_config
    model_type = config.get("model_type", "vit")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is not supported; Hugging Face 'vit' (ViTForImageClassification, "
            "ViTModel), 'deit' (DeiTForImageClassification, DeiTForImageClassificationWithTeacher, DeiTModel), "
            "'dinov2' and 'dinov2_with_registers' (Dinov2ForImageClassification, "
            "Dinov2WithRegistersForImageClassification, their Model), 'clip' (CLIPModel: its image tower), "
            "'clip_vision_model' (CLIPVisionModel, CLIPVisionModelWithProjection), 'siglip' and 'siglip_vision_model' "
            "(SiglipModel's image tower, SiglipVisionModel, SiglipForImageClassification) checkpoints load"
        )
    width = width_of(config)
    if "pooler.weight" in (state or {}) and (
        config.get("pooler_act", "tanh") != "tanh" or config.get("pooler_output_size", width) != width
    ):
        raise CheckpointError(
            f"{where}: the pooler (pooler_act {config.get('pooler_act')!r}, pooler_output_size "
            f"{config.get('pooler_output_size')!r}) is not transformers' default (tanh, hidden_size); vitdeploy runs "
            "that one only: its embedding would differ from pooler_output"
        )
    config = {**_DEFAULTS.get(model_type, {}), **config}
    state = state or {}
    dinov2 = model_type in DINOV2_RESAMPLE_ANTIALIAS
    swiglu = dinov2 and bool(config.get("use_swiglu_ffn"))  # SiLU-gated: hidden_act is not read
    hidden_act = "gelu" if swiglu else config.get("hidden_act", "gelu")
    if hidden_act not in HF_ACTS:
        raise CheckpointError(
            f"{where}: hidden_act {hidden_act!r} is not supported; vitdeploy's ViT runs the exact GELU ('gelu') "
            f"or its tanh form ({', '.join(k for k, v in HF_ACTS.items() if v == 'gelu_tanh')}). Loading this "
            "checkpoint would change its outputs"
        )
    width = int(config.get("hidden_size", 768))
    # DINOv2 sizes its MLP by mlp_ratio (int(hidden_size * mlp_ratio); SwiGLU: two thirds of that, rounded up
    # to a multiple of 8), the others by intermediate_size
    mlp = int(width * config.get("mlp_ratio", 4)) if dinov2 else int(config.get("intermediate_size", 3072))
    if swiglu:
        mlp = dinov2_swiglu_hidden(width, config.get("mlp_ratio", 4))
    reg, pos = state.get("reg_token"), state.get("pos_embed")
    image = _square(config.get("image_size", 224), "image_size", where)
    patch = _square(config.get("patch_size", 16), "patch_size", where)
    # the DINOv2 classifier reads the class token and the mean patch token; without a head (the Model classes)
    # the features are the class token, transformers' pooler_output; SigLIP: siglip.family
    tokens = {"pool": "token_avg" if dinov2 and "head.weight" in state else "token"}
    if model_type in siglip.SIGLIP_TYPES:
        tokens = siglip.family(config, state, where, image, patch)
    try:
        cfg = ViTConfig(
            image_size=image,
            patch_size=patch,
            in_channels=int(config.get("num_channels", 3)),
            width=width,
            depth=int(config.get("num_hidden_layers", 12)),
            heads=int(config.get("num_attention_heads", 12)),
            mlp_ratio=mlp / width,
            qkv_bias=bool(config.get("qkv_bias", True)),
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            num_classes=num_classes,
            act=HF_ACTS[hidden_act],
            mlp="swiglu" if swiglu else "gelu",
            distilled="dist_token" in state,
            reg_tokens=int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0,
            layer_scale=any(k.endswith(".ls1.gamma") for k in state),
            pooler="pooler.weight" in state,
            **clip_family(state),  # CLIP: the norm before the blocks, the projection
            # with registers the table has the patch rows only (the class row is in cls_token)
            pos_embed_prefix=not (
                reg is not None and pos is not None and pos.ndim == 3 and pos.shape[1] == _grid_cells(config, where)
            ),
            **tokens,
        )
    except ValueError as exc:
        raise CheckpointError(f"{where}: config.json describes an invalid ViT: {exc}") from exc
    if cfg.mlp_dim != mlp:
        raise CheckpointError(f"{where}: intermediate_size {mlp} cannot be represented for hidden_size {width}")
    return cfg


def width_of(config: dict[str, Any]) -> int:
    return int(config.get("hidden_size", 768))


def _grid_cells(config: dict[str, Any], where: Path) -> int:
    side = _square(config.get("image_size", 224), "image_size", where) // _square(
        config.get("patch_size", 16), "patch_size", where
    )
    return side * side


def dinov2_input_size(config: dict[str, Any], cfg: "ViTConfig", spec: PreprocessSpec, where: Path) -> int | None:
    """The side transformers runs a DINOv2 model at when its processor's crop differs from config.json's
    ``image_size`` (it resamples the position table to that input at every call); None when they agree or
    the model is not DINOv2. CheckpointError for a non-square crop (a non-square grid)."""
    if config.get("model_type") not in DINOV2_RESAMPLE_ANTIALIAS or (spec.height, spec.width) == (cfg.image_size,) * 2:
        return None
    if spec.height != spec.width:
        raise CheckpointError(
            f"{where}: the processor's {spec.height}x{spec.width} crop would make transformers "
            "resample the position table to a non-square grid; vitdeploy's ViT is square: set "
            "preprocess height/width or model.image_size"
        )
    if spec.height % cfg.patch_size:
        raise CheckpointError(
            f"{where}: the processor's {spec.height} px crop is not a multiple of the patch size "
            f"{cfg.patch_size}; set model.image_size"
        )
    return spec.height


def hf_labels(config: dict[str, Any], num_classes: int, where: Path) -> tuple[str, ...] | None:
    """Labels ordered by class index from id2label; None when the config has none."""
    id2label = config.get("id2label")
    if not id2label or num_classes == 0:
        return None
    try:
        by_index = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{where}: id2label must map class indices to names, got {id2label!r:.200}") from exc
    if set(by_index) != set(range(num_classes)):
        raise CheckpointError(
            f"{where}: id2label has {len(by_index)} entries (indices {sorted(by_index)[:5]}...) but the "
            f"classifier has {num_classes} outputs; fix id2label in config.json"
        )
    return tuple(by_index[i] for i in range(num_classes))


def _triple(value: Any, key: str, where: Path) -> tuple[float, float, float]:
    if isinstance(value, (int, float)):
        return (float(value),) * 3
    if isinstance(value, (list, tuple)) and len(value) == 3:
        return tuple(float(v) for v in value)  # type: ignore[return-value]
    raise CheckpointError(f"{where}: {key} must be one number or three, got {value!r}")


def _size_pair(value: Any, key: str, where: Path) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, dict) and "height" in value and "width" in value:
        return int(value["height"]), int(value["width"])
    raise CheckpointError(f"{where}: {key} {value!r} is not understood; expected an int or {{height, width}}")


def hf_preprocess(data: dict[str, Any], image_size: int, where: Path) -> Preprocessing:
    """Preprocessing from a HF preprocessor_config.json, as transformers' image processor (PIL backend)
    does it, with every form of ``size``: ``{height, width}``, ``{shortest_edge}``,
    ``{shortest_edge, longest_edge}`` and an int (a square, except for the processors whose class reads
    it as the shortest edge), each with and without ``do_center_crop``.

    HF computes ``(pixel * rescale_factor - mean) / std`` on 0-255 pixels; our spec computes
    ``(pixel / 255 - mean') / std'``, so mean and std are divided by ``255 * rescale_factor`` (a no-op
    for the usual 1/255). ``do_normalize: false`` means mean 0, std 1; ``do_rescale: false`` a factor of 1.
    Absent keys take the ``BaseImageProcessor`` defaults (bilinear, mean/std 0.5), noted as such.
    """
    origin, default = f"{CHECKPOINT}: {where.name}", f"{LIBRARY}: transformers image processor"
    missing: dict[str, str] = {}
    notes: list[str] = []
    kind = str(data.get("image_processor_type") or "").removesuffix("Fast").removesuffix("Pil")
    if "crop_pct" in data:
        raise CheckpointError(
            f"{where}: {kind or 'this image processor'} resizes by crop_pct, which vitdeploy does "
            "not reproduce for Hugging Face processors; set the preprocessing in pipeline.yaml "
            "(preprocess: style: timm, crop_pct: ...)"
        )
    resample = data.get("resample", _DEFAULT_RESAMPLE.get(kind, 2))
    if "resample" not in data:
        missing["interpolation"] = default
    if isinstance(resample, str) and resample.lower() in PIL_RESAMPLE.values():
        interpolation = resample.lower()
    elif isinstance(resample, int) and resample in PIL_RESAMPLE:
        interpolation = PIL_RESAMPLE[resample]
    else:
        raise CheckpointError(f"{where}: unknown resample {resample!r}; expected a PIL code 0-5")

    for key, field in (("image_mean", "mean"), ("image_std", "std")):
        if key not in data:
            missing[field] = default
    mean = _triple(data.get("image_mean", 0.5), "image_mean", where)
    std = _triple(data.get("image_std", 0.5), "image_std", where)
    if not data.get("do_normalize", True):
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    factor = float(data.get("rescale_factor", 1 / 255)) if data.get("do_rescale", True) else 1.0
    scale = 255.0 * factor
    if not math.isclose(scale, 1.0, rel_tol=1e-9):
        mean = tuple(m / scale for m in mean)  # type: ignore[assignment]
        std = tuple(s / scale for s in std)  # type: ignore[assignment]

    size = data.get("size")
    crop = data.get("crop_size") if data.get("do_center_crop") else None
    height = width = image_size
    if crop is not None:
        height, width = _size_pair(crop, "crop_size", where)
    geometry: dict[str, Any] = {}
    if isinstance(size, int) and not isinstance(size, bool):
        size = {"shortest_edge": size} if kind in _INT_SIZE_IS_SHORTEST_EDGE else {"height": size, "width": size}
    if not data.get("do_resize", True) or size is None:
        notes.append(
            f"{where.name}: {'do_resize is false' if size is not None else 'no size'}; images are resized "
            f"to the model's {image_size}x{image_size} (transformers would pass them through at their own "
            "size, which the model cannot take)"
        )
        missing.update(
            height=f"{LIBRARY} (assumed): the model's image size", width=f"{LIBRARY} (assumed): the model's image size"
        )
    elif isinstance(size, dict) and "height" in size and "width" in size:
        rh, rw = int(size["height"]), int(size["width"])
        if crop is None:
            height, width = rh, rw
        else:
            geometry = {"resize_height": rh, "resize_width": rw}
    elif isinstance(size, dict) and "shortest_edge" in size:
        geometry = {"shortest_edge": int(size["shortest_edge"])}
        if size.get("longest_edge") is not None:
            geometry["longest_edge"] = int(size["longest_edge"])
        if crop is None:
            notes.append(
                f"{where.name}: size {size} without a centre crop gives transformers a tensor of the photo's "
                f"aspect ratio, which the model cannot take unless the photo is square; vitdeploy "
                f"centre-crops {image_size}x{image_size} as transformers' crop would (floored offset)"
            )
            missing.update(
                height=f"{LIBRARY} (assumed): the model's image size",
                width=f"{LIBRARY} (assumed): the model's image size",
            )
    else:
        raise CheckpointError(
            f"{where}: unsupported size {size!r}; expected an int, {{height, width}}, "
            "{shortest_edge} or {shortest_edge, longest_edge}"
        )
    try:
        spec = PreprocessSpec(
            style="hf", height=height, width=width, interpolation=interpolation, mean=mean, std=std, **geometry
        )
    except ValueError as exc:
        raise CheckpointError(f"{where}: unusable preprocessing: {exc}") from exc
    return Preprocessing.from_source(spec, origin, missing, tuple(notes))
