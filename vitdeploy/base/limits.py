"""Bounds on what vitdeploy accepts from files and the command line, defined once.

Anything above these is refused with a message (exit 2), never attempted: a batch of a billion
images or a YAML file that expands to gigabytes would otherwise end in a MemoryError traceback.
"""

from __future__ import annotations

from typing import Any

#: Largest batch size anywhere (export profile, runtime.batch_size, predict/bench flags). A ViT-B
#: batch of 4096 at 224 px is already 2.5 GB of float32 input; TensorRT profiles stop well below.
MAX_BATCH = 4096

#: pipeline.yaml: size on disk, nesting depth, and nodes after expanding anchors/aliases.
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 10_000

#: manifest.json and the small JSON files beside artifacts (model.json, model.engine.json).
MAX_JSON_BYTES = 16 << 20

#: A value echoed in an error message is cut to this many characters.
MAX_ECHO = 200


def clip(value: Any, limit: int = MAX_ECHO) -> str:
    """``repr(value)`` cut to ``limit`` characters (with the full length said), for error messages.

    A hostile file can hold a 30-million-character value; an error line must stay one screen.
    Very large containers are not repr'd whole: only enough of them to fill the limit.
    """
    text = _bounded_repr(value, limit + 1)
    if len(text) <= limit:
        return text
    return text[: limit - 1] + f"… ({type(value).__name__}, cut at {limit} characters)"


def clip_text(text: str, limit: int = MAX_ECHO) -> str:
    """A plain string cut to ``limit`` characters."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bounded_repr(value: Any, budget: int) -> str:
    if budget <= 0:
        return "..."
    if isinstance(value, str):
        return repr(value[:budget])
    if isinstance(value, (list, tuple)):
        parts, used = [], 0
        for item in value:
            if used > budget:
                parts.append("...")
                break
            part = _bounded_repr(item, budget - used - 2)
            parts.append(part)
            used += len(part) + 2
        inner = ", ".join(parts)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        parts, used = [], 0
        for key, item in value.items():
            if used > budget:
                parts.append("...")
                break
            part = f"{_bounded_repr(key, budget - used - 2)}: {_bounded_repr(item, budget - used - 2)}"
            parts.append(part)
            used += len(part) + 2
        return "{" + ", ".join(parts) + "}"
    return repr(value)[:budget]


def check_batch_size(value: Any, what: str = "batch size") -> int:
    """``value`` as an int in 1..MAX_BATCH; ConfigError (exit 2) naming ``what`` otherwise."""
    from .errors import ConfigError

    if isinstance(value, bool):
        raise ConfigError(f"{what} must be an integer 1..{MAX_BATCH}, got {clip(value)}")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be an integer 1..{MAX_BATCH}, got {clip(value)}") from None
    if not 1 <= n <= MAX_BATCH:
        raise ConfigError(
            f"{what} {clip(value)} is out of range: batch sizes are 1..{MAX_BATCH} (a ViT batch of "
            f"{MAX_BATCH} at 224 px is already 2.5 GB of input)"
        )
    return n
