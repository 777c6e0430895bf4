"""The ViT architecture as a checkpoint config or model.json states it, validated strictly.

Pure pydantic (no torch): the runtime checks an export's model.json with it, and the checkpoint
loaders check our model.json with it before building anything. Every value is typed ("768" and
null are refused, not coerced), positive where a size, and the sizes must fit together (width
divisible by heads, image divisible by patch), so no impossible config reaches a ZeroDivisionError
or a multi-gigabyte allocation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, ValidationError, model_validator

from ._schema import FiniteFloat, NonNegativeInt, PositiveInt, StrictSection, format_validation_error
from .errors import VitDeployError
from .vocab import Activation, Pool

# Generous ceilings: ViT-22B has width 6144, depth 48; they stop hostile values, not real models.
MAX_WIDTH, MAX_DEPTH, MAX_SIDE, MAX_CLASSES = 65_536, 1_024, 16_384, 1_000_000


class ViTFields(StrictSection):
    """model.json "vit" (the fields and defaults of model.vit.ViTConfig)."""

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
    pos_embed: Literal["learned", "sincos"] = "learned"
    act: Activation = "gelu"
    class_token: StrictBool = True
    distilled: StrictBool = False
    reg_tokens: Annotated[NonNegativeInt, Field(le=1024)] = 0
    pool: Pool = "token"
    fc_norm: StrictBool = False
    layer_scale: StrictBool = False
    qk_norm: StrictBool = False
    pos_embed_prefix: StrictBool = True

    @model_validator(mode="after")
    def _fit(self) -> "ViTFields":
        check_fit(width=self.width, heads=self.heads, image=self.image_size, patch=self.patch_size,
                  names=("width", "heads", "image_size", "patch_size"))
        if self.pos_embed == "sincos" and self.width % 4:
            raise ValueError(f"pos_embed 'sincos' needs width divisible by 4, got width {self.width}")
        problems = family_problems(class_token=self.class_token, distilled=self.distilled, reg_tokens=self.reg_tokens,
                                   pool=self.pool, fc_norm=self.fc_norm)
        if problems:
            raise ValueError("; ".join(problems))
        return self


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


def check_fit(*, width: int, heads: int, image: int, patch: int, names: tuple[str, str, str, str]) -> None:
    """ValueError unless width % heads == 0 and image % patch == 0 (names: the keys, for the message)."""
    if width % heads:
        raise ValueError(f"{names[0]} {width} is not divisible by {names[1]} {heads}")
    if image % patch:
        raise ValueError(f"{names[2]} {image} is not a multiple of {names[3]} {patch}")


def validate_vit_config(data: Any, path: Path | str, *, key_prefix: str = "",
                        error: type[VitDeployError] = VitDeployError) -> dict[str, Any]:
    """``data`` validated as ViTFields; a dict of every field. ``error`` (naming ``path`` and the key) otherwise."""
    if not isinstance(data, dict):
        raise error(f"{path}: '{key_prefix or 'vit'}' must be an object of ViT sizes, got {type(data).__name__}")
    try:
        return ViTFields.model_validate(data).model_dump()
    except ValidationError as exc:
        prefix = (key_prefix,) if key_prefix else ()
        raise error(format_validation_error(exc, str(path), prefix=prefix)) from None
