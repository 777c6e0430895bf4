"""The Hugging Face environment, read at each call: ``huggingface_hub`` reads it once, at import, so a
process that imported it (transformers does) before the variables changed would not see them. Each
value is the one ``huggingface_hub`` documents, with its own default when unset."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

#: the values huggingface_hub reads as true
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubSettings:
    endpoint: str = field(repr=False)  # HF_ENDPOINT (a user:password in it too), else huggingface_hub's default
    cache_dir: Path  # HF_HUB_CACHE, else HF_HOME/hub, else huggingface_hub's default
    offline: bool  # HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value
    token_set: bool  # a token is set (HF_TOKEN, or one saved by `hf auth login`); its value is never kept here

    @property
    def shown_endpoint(self) -> str:
        """The endpoint without any user:password part (for messages and the manifest)."""
        parts = urlsplit(self.endpoint)
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().upper() in _TRUE


def hub_settings() -> HubSettings:
    from huggingface_hub import constants, get_token

    env = os.environ
    endpoint = (env.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        cache = env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]
    elif env.get("HF_HOME"):
        cache = os.path.join(env["HF_HOME"], "hub")
    else:
        cache = constants.HF_HUB_CACHE
    offline = _is_true(env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE")) or constants.HF_HUB_OFFLINE
    if "HF_HUB_OFFLINE" in env and not _is_true(env["HF_HUB_OFFLINE"]):
        offline = False  # set to false now: online, whatever it was at import
    return HubSettings(
        endpoint=endpoint,
        cache_dir=Path(os.path.expandvars(os.path.expanduser(cache))),
        offline=offline,
        token_set=get_token() is not None,
    )


def scrub(text: str) -> str:
    """``text`` without the token, wherever it might have been echoed."""
    from huggingface_hub import get_token

    token = get_token()
    return text.replace(token, "***") if token else text
