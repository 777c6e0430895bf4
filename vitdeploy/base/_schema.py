"""What every pydantic schema of vitdeploy shares: strict field types and one error format.

pipeline.yaml (config.py), manifest.json (runtime/manifest_schema.py) and checkpoint configs
(model/config_schema.py) are all validated with these, so a bad value reads the same everywhere:
``<file>: '<key>' = <value, at most 200 characters>: <what is allowed>``.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from .limits import MAX_BATCH, clip, clip_text

#: A float that is a real number (no NaN, no infinity); ints are accepted and converted.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
#: An int that is an int in the file: "768", 768.0 and true are refused.
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
#: Images in one model call, 1..MAX_BATCH (pipeline.yaml's batch sizes).
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH, description=f"1..{MAX_BATCH}")]


class StrictSection(BaseModel):
    """A frozen section that refuses unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def key_of(loc: tuple[Any, ...]) -> str:
    """('artifacts', 'onnx', 'sha256') -> 'artifacts.onnx.sha256'; list indices as [i]."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + clip_text(str(part), 80)
    return out or "(top level)"


def format_validation_error(
    exc: ValidationError,
    label: str,
    allowed_keys: Optional[Callable[[tuple[Any, ...]], Optional[str]]] = None,
    limit: int = 5,
    prefix: tuple[Any, ...] = (),
) -> str:
    """One line naming every bad key (at most ``limit``) with its value clipped to 200 characters.
    ``prefix``: the keys above the validated object (e.g. ("vit",) for model.json's "vit")."""
    parts = []
    errors = exc.errors()
    for err in errors[:limit]:
        loc = prefix + tuple(
            p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))
        )
        key = key_of(loc)
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):  # a model's / a dataclass's
            allowed = allowed_keys(loc[len(prefix) : -1]) if allowed_keys else None
            parts.append(f"unknown key '{key}'" + (f" (allowed here: {allowed})" if allowed else ""))
        elif err["type"] == "missing":
            parts.append(f"'{key}' is missing")
        else:
            msg = clip_text(err["msg"].removeprefix("Value error, "), 300)
            parts.append(f"'{key}' = {clip(err.get('input'))}: {msg}")
    if len(errors) > limit:
        parts.append(f"and {len(errors) - limit} more problem(s)")
    return f"{label}: " + "; ".join(parts)
