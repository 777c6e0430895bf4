"""What ``model.checkpoint`` (or ``vitdeploy export MODEL``) names: a path on disk, or a model on the
Hugging Face Hub, told apart before anything is downloaded.

* A path that exists always wins, as in transformers' ``from_pretrained``.
* ``org/name`` is a Hub repo id; ``org/name@rev`` pins a revision (a branch, a tag or a commit), as does
  ``model.revision`` / ``--revision``; timm's ``hf-hub:org/name`` prefix is accepted too (timm's own hub
  repos are plain repo ids: ``timm/vit_base_patch16_224.augreg2_in21k_ft_in1k``).

Pure string work: the download is ``vitdeploy.model.hub``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from .errors import ConfigError
from .limits import clip

#: timm's prefix for a model on the Hub (``timm.create_model("hf-hub:timm/...")``).
HUB_PREFIX = "hf-hub:"
# The Hub's rule for a repo id: namespace/name, letters, digits, '-', '_' and '.', at most 96 characters,
# no '--' or '..', not starting or ending with '-' or '.'.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"^{_PART}/{_PART}$")
_REVISION = re.compile(r"^[^\s\x00~^:?*\[\\]{1,255}$")  # what git allows in a ref name, roughly
#: a name ending so is a file that does not exist, never a repo (``missing/vit.safetensors``)
FILE_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".json", ".yaml", ".yml", ".onnx", ".npz")


@dataclass(frozen=True)
class HubName:
    """A model on the Hub: its repo id and the revision asked for (None: the repo's default branch)."""

    repo_id: str
    revision: Optional[str] = None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id

    @property
    def short_name(self) -> str:
        """The repo's name without its namespace (``vit-base-patch16-224``)."""
        return self.repo_id.split("/", 1)[1]


def is_repo_id(text: str) -> bool:
    """``org/name`` as the Hub spells repo ids (a name ending like a checkpoint file is taken for a path)."""
    return (
        len(text) <= 96
        and bool(_REPO_ID.match(text))
        and "--" not in text
        and ".." not in text
        and not text.lower().endswith(FILE_SUFFIXES)
    )


def parse_hub_name(text: str, revision: Optional[str] = None, *, key: str = "model.checkpoint") -> Optional[HubName]:
    """The Hub name ``text`` spells (``org/name``, ``org/name@rev``, ``hf-hub:org/name[@rev]``), or None when
    it is not one. ``revision`` (``--revision`` / ``model.revision``) pins the revision too; ConfigError when
    it contradicts ``@rev``, or for an ``hf-hub:`` name that is no repo id."""
    prefixed = text.startswith(HUB_PREFIX)
    body = text[len(HUB_PREFIX) :] if prefixed else text
    repo_id, at, rev = body.partition("@")
    if not is_repo_id(repo_id) or (at and not rev):
        if prefixed:
            raise ConfigError(
                f"{key} = {clip(text)}: not a Hub name; after {HUB_PREFIX} give a repo id org/name "
                "(e.g. hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k), optionally @revision"
            )
        return None
    if rev and revision and rev != revision:
        raise ConfigError(
            f"{key} = {clip(text)} pins revision {clip(rev)} but the revision given is {clip(revision)}; give one"
        )
    rev = rev or revision
    if rev is not None and not _REVISION.match(rev):
        raise ConfigError(f"{key} = {clip(text)}: {clip(rev)} is not a revision (a branch, a tag or a commit)")
    return HubName(repo_id, rev or None)


def checkpoint_ref(
    value: Union[str, Path, None], base_dir: Path, revision: Optional[str] = None, *, key: str = "model.checkpoint"
) -> Union[Path, HubName, None]:
    """What ``value`` names: None (nothing: the demo model), an existing path (relative ones against
    ``base_dir``), or a Hub name. ConfigError naming ``key`` for anything else, saying both forms."""
    if value is None:
        if revision is not None:
            raise ConfigError(f"a revision ({clip(revision)}) was given without a Hub name in {key}")
        return None
    text = str(value)
    if not text.startswith(HUB_PREFIX):
        path = Path(text).expanduser()
        path = path if path.is_absolute() else (base_dir / path).resolve()
        if path.exists():
            if revision is not None:
                raise ConfigError(
                    f"{key} = {clip(text)} is a local path ({clip(str(path))}); a revision ({clip(revision)}) "
                    "applies only to a Hugging Face Hub name (org/name)"
                )
            return path
    name = parse_hub_name(text, revision, key=key)
    if name is not None:
        return name
    raise ConfigError(
        f"'{key}' = {clip(text)}: no such file or directory ({clip(str(path))}), and not a Hugging Face Hub name "
        "(org/name, org/name@revision, hf-hub:org/name)"
    )


__all__ = ["HUB_PREFIX", "HubName", "checkpoint_ref", "is_repo_id", "parse_hub_name"]
