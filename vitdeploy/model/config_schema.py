"""Every value a checkpoint's config files state, validated before the loaders use it.

A checkpoint directory is input: ``num_attention_heads: 0``, ``hidden_size: "768"`` or ``null``,
``heads: 0`` in our model.json must be refused with the key and the file named (CheckpointError,
exit 2), not reach a ZeroDivisionError. The same rigour as pipeline.yaml: strict types (a string
is not a number, a float is not an int, true is not 1), sizes > 0 and below generous ceilings,
and sizes that fit together (width divisible by heads, image by patch).

Files checked: Hugging Face ``config.json`` and ``preprocessor_config.json``, timm hub
``config.json`` (``pretrained_cfg``, ``model_args``, ``label_names``), OpenCLIP ``open_clip_config.json``
(``model_cfg``, ``preprocess_cfg``), vitdeploy ``model.json``.
Keys a format has and vitdeploy does not read are allowed (those files carry many).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..base._schema import FiniteFloat, NonNegativeInt, PositiveInt, format_validation_error
from ..base.errors import CheckpointError
from ..base.vit_schema import MAX_CLASSES, MAX_DEPTH, MAX_SIDE, MAX_WIDTH, check_fit, validate_vit_config
from ..base.vocab import INTERPOLATIONS, Interpolation
from .formats.hf import convert_siglip as siglip

Side = Annotated[PositiveInt, Field(le=MAX_SIDE)]
Std = Annotated[FiniteFloat, Field(gt=0)]


class _Open(BaseModel):
    """Keys vitdeploy does not read are allowed; those it reads are strict."""

    model_config = ConfigDict(extra="allow", frozen=True)


def _side_or_pair(value: Any) -> Any:
    """A positive integer or [h, w] of them (HF image_size / patch_size)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if len(items) not in (1, 2) or any(type(v) is not int or not 0 < v <= MAX_SIDE for v in items):
        raise ValueError(f"must be a positive integer (or [height, width]) up to {MAX_SIDE}")
    return value


class HFConfig(_Open):
    """transformers' ViTConfig keys (with its defaults) that vitdeploy reads; DINOv2's too."""

    model_type: StrictStr = "vit"
    hidden_size: Annotated[PositiveInt, Field(le=MAX_WIDTH)] = 768
    num_hidden_layers: Annotated[PositiveInt, Field(le=MAX_DEPTH)] = 12
    num_attention_heads: Annotated[PositiveInt, Field(le=MAX_WIDTH)] = 12
    intermediate_size: Annotated[PositiveInt, Field(le=64 * MAX_WIDTH)] = 3072
    num_channels: Annotated[PositiveInt, Field(le=64)] = 3
    image_size: Any = 224
    patch_size: Any = 16
    layer_norm_eps: Annotated[FiniteFloat, Field(gt=0, lt=1)] = 1e-12
    qkv_bias: StrictBool = True
    hidden_act: StrictStr = "gelu"
    id2label: Optional[dict[str, StrictStr]] = None
    mlp_ratio: Annotated[FiniteFloat, Field(gt=0, le=64)] = 4  # DINOv2 (no intermediate_size)
    use_swiglu_ffn: StrictBool = False
    num_register_tokens: Annotated[NonNegativeInt, Field(le=1024)] = 0

    @field_validator("image_size", "patch_size")
    @classmethod
    def _sides(cls, v: Any) -> Any:
        return _side_or_pair(v)

    @model_validator(mode="after")
    def _fit(self) -> "HFConfig":
        image = self.image_size if isinstance(self.image_size, int) else self.image_size[0]
        patch = self.patch_size if isinstance(self.patch_size, int) else self.patch_size[0]
        if self.model_type in siglip.SIGLIP_TYPES and image > patch:  # its valid convolution drops the remainder
            image -= image % patch
        check_fit(
            width=self.hidden_size,
            heads=self.num_attention_heads,
            image=image,
            patch=patch,
            names=("hidden_size", "num_attention_heads", "image_size", "patch_size"),
        )
        return self


class _SizeDict(_Open):
    height: Optional[Side] = None
    width: Optional[Side] = None
    shortest_edge: Optional[Side] = None


class HFPreprocessorConfig(_Open):
    """preprocessor_config.json keys read by formats/hf/convert.hf_preprocess."""

    do_resize: StrictBool = True
    do_rescale: StrictBool = True
    do_normalize: StrictBool = True
    do_center_crop: StrictBool = False
    rescale_factor: Annotated[FiniteFloat, Field(gt=0)] = 1 / 255
    image_mean: Any = 0.5
    image_std: Any = 0.5
    size: Optional[Any] = None
    crop_size: Optional[Any] = None
    resample: Any = 2

    @field_validator("image_mean", "image_std")
    @classmethod
    def _triple(cls, v: Any, info: Any) -> Any:
        items = v if isinstance(v, (list, tuple)) else [v]
        ok = len(items) in (1, 3) and all(type(x) in (int, float) and x == x and abs(x) != float("inf") for x in items)
        if not ok or (info.field_name == "image_std" and any(x <= 0 for x in items)):
            raise ValueError(
                "must be one finite number or three" + (" (each > 0)" if info.field_name == "image_std" else "")
            )
        return v

    @field_validator("size", "crop_size")
    @classmethod
    def _size(cls, v: Any) -> Any:
        if v is None or (type(v) is int and 0 < v <= MAX_SIDE):
            return v
        if isinstance(v, dict):
            _SizeDict.model_validate(v)
            return v
        raise ValueError(f"must be a positive integer up to {MAX_SIDE} or {{height, width}} / {{shortest_edge}}")

    @field_validator("resample")
    @classmethod
    def _resample(cls, v: Any) -> Any:
        if (type(v) is int and 0 <= v <= 5) or (isinstance(v, str) and v.lower() in INTERPOLATIONS):
            return v
        raise ValueError("must be a PIL resampling code 0-5 or a filter name")


class TimmPretrainedCfg(_Open):
    input_size: Optional[tuple[Annotated[PositiveInt, Field(le=64)], Side, Side]] = None
    crop_pct: Annotated[FiniteFloat, Field(gt=0, le=1)] = 0.875
    crop_mode: StrictStr = "center"
    interpolation: Interpolation = "bicubic"
    mean: tuple[FiniteFloat, FiniteFloat, FiniteFloat] = (0.485, 0.456, 0.406)
    std: tuple[Std, Std, Std] = (0.229, 0.224, 0.225)
    num_classes: Optional[Annotated[NonNegativeInt, Field(le=MAX_CLASSES)]] = None


class TimmModelArgs(_Open):
    num_heads: Optional[Annotated[PositiveInt, Field(le=MAX_WIDTH)]] = None
    global_pool: Optional[StrictStr] = None
    reg_tokens: Optional[Annotated[NonNegativeInt, Field(le=1024)]] = None
    class_token: Optional[StrictBool] = None
    no_embed_class: Optional[StrictBool] = None
    fc_norm: Optional[StrictBool] = None
    qk_norm: Optional[StrictBool] = None
    pool_include_prefix: Optional[StrictBool] = None


class TimmHubConfig(_Open):
    architecture: StrictStr
    num_classes: Optional[Annotated[NonNegativeInt, Field(le=MAX_CLASSES)]] = None
    label_names: Optional[list[StrictStr]] = None
    global_pool: Optional[StrictStr] = None
    pretrained_cfg: Optional[TimmPretrainedCfg] = None
    model_args: Optional[TimmModelArgs] = None


class OpenClipVisionCfg(_Open):
    """open_clip_config.json ``model_cfg.vision_cfg`` keys read by formats/open_clip (ViT towers)."""

    image_size: Any = 224
    patch_size: Any = 16
    width: Optional[Annotated[PositiveInt, Field(le=MAX_WIDTH)]] = None
    head_width: Optional[Annotated[PositiveInt, Field(le=MAX_WIDTH)]] = None
    layers: Any = None  # an int (a ViT) or a list (open_clip's ResNet, refused by the reader)
    pool_type: StrictStr = "tok"
    final_ln_after_pool: StrictBool = False
    no_ln_pre: StrictBool = False

    @field_validator("image_size", "patch_size")
    @classmethod
    def _sides(cls, v: Any) -> Any:
        return _side_or_pair(v)


class OpenClipModelCfg(_Open):
    quick_gelu: StrictBool = False
    vision_cfg: OpenClipVisionCfg = OpenClipVisionCfg()


class OpenClipPreprocessCfg(_Open):
    mean: Optional[tuple[FiniteFloat, FiniteFloat, FiniteFloat]] = None
    std: Optional[tuple[Std, Std, Std]] = None
    interpolation: StrictStr = "bicubic"
    resize_mode: StrictStr = "shortest"


class OpenClipConfig(_Open):
    """open_clip_config.json as the Hub holds it (``model_cfg``, ``preprocess_cfg``)."""

    model_cfg: OpenClipModelCfg
    preprocess_cfg: Optional[OpenClipPreprocessCfg] = None


class OurModelJson(_Open):
    format: Literal["vitdeploy"]
    version: Literal[1]
    name: Optional[Annotated[StrictStr, Field(max_length=256)]] = None
    vit: dict[str, Any]
    labels: list[Annotated[StrictStr, Field(max_length=1024)]]
    preprocess: Optional[dict[str, Any]] = None


def _validate(schema: type[BaseModel], data: Any, path: Path, prefix: tuple[str, ...] = ()) -> BaseModel:
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise CheckpointError(
            format_validation_error(exc, str(path), prefix=prefix) + "; fix the file or re-save the checkpoint"
        ) from None


def check_checkpoint_config(fmt: str, meta: dict[str, Any], meta_dir: Path | None) -> None:
    """Validate the config files of a resolved checkpoint (``fmt`` as detected, ``meta`` the parsed
    model.json / config.json, ``meta_dir`` their folder). CheckpointError naming file and key."""
    if not meta or meta_dir is None:
        return  # a bare state dict: everything comes from tensor shapes
    if fmt == "vitdeploy":
        path = meta_dir / "model.json"
        ours = _validate(OurModelJson, meta, path)
        vit = validate_vit_config(ours.vit, path, key_prefix="vit", error=CheckpointError)  # type: ignore[attr-defined]
        labels = ours.labels  # type: ignore[attr-defined]
        if len(labels) != vit["num_classes"]:
            raise CheckpointError(
                f"{path}: 'labels' has {len(labels)} entries but 'vit.num_classes' is "
                f"{vit['num_classes']}; one label per class"
            )
    elif fmt == "hf":
        siglip.refuse_naflex(meta, meta_dir / "config.json")
        if siglip.is_siglip(meta):  # the image tower's config (a SiglipModel's vision_config), flat
            nested = ("vision_config",) if meta.get("model_type") == "siglip" else ()
            _validate(HFConfig, siglip.vision_config(meta, meta_dir / "config.json"), meta_dir / "config.json", nested)
        else:
            from .formats.hf.convert_clip import vision_meta

            _validate(HFConfig, vision_meta(meta), meta_dir / "config.json")  # a CLIPModel: its vision_config
        pp = meta_dir / "preprocessor_config.json"
        if pp.is_file():
            from .formats.shared import read_json

            _validate(HFPreprocessorConfig, read_json(pp), pp)
    elif fmt == "timm":
        _validate(TimmHubConfig, meta, meta_dir / "config.json")
    elif fmt == "open_clip":
        data = meta if "model_cfg" in meta else {"model_cfg": meta}  # a model config itself: open_clip reads both
        _validate(OpenClipConfig, data, meta_dir / "open_clip_config.json")
