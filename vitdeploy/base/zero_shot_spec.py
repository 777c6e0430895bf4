"""What a zero-shot classifier is made of, defined once: ``model.zero_shot`` (:class:`ZeroShotSection`), its
class names and its prompt templates. Torch-free: the config reads it, the export's text side
(``model/zero_shot.py``) runs it.

``labels``: the class names, a list in pipeline.yaml or a labels file (one name a line; blank lines skipped;
``vitdeploy export --labels FILE``). ``templates``: the prompts each name is put into (``"a photo of a {}."``);
every template's text embedding of a class is L2-normalised, the class's are averaged and the mean normalised
again, as CLIP's prompt ensembling does. Absent: :data:`DEFAULT_TEMPLATES`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional, Union

from pydantic import Field, StrictStr, field_validator

from ._schema import StrictSection
from .errors import ConfigError
from .limits import clip

#: The default prompts: the seven templates OpenAI selected from its 80 ImageNet prompts for CLIP's prompt
#: ensembling (CLIP's Prompt_Engineering_for_ImageNet notebook; open_clip's ``SIMPLE_IMAGENET_TEMPLATES``).
DEFAULT_TEMPLATES: tuple[str, ...] = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)
#: Bounds on what a user may ask for (the text tower runs once per class and template).
MAX_LABELS, MAX_TEMPLATES, MAX_TEXT = 100_000, 1_000, 1_024
SLOT = "{}"

Text = Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT)]


class ZeroShotSection(StrictSection):
    """``model.zero_shot``: a zero-shot classifier compiled from a CLIP / SigLIP checkpoint's text tower."""

    labels: Union[Path, tuple[Text, ...]] = Field(
        ...,
        description="the class names: a list, or a labels file (one name a line, relative to this file; "
        "`vitdeploy export --labels FILE`); the checkpoint's text tower embeds them once, at export time",
    )
    templates: Optional[tuple[Text, ...]] = Field(
        None,
        description="prompts holding '{}' once, where each class name goes; each class's prompt embeddings are "
        "L2-normalised, averaged and normalised again (CLIP's ensembling); absent = the 7 templates of CLIP's "
        "ImageNet notebook ('itap of a {}.', 'a bad photo of the {}.', ...; docs/zero-shot.md)",
    )

    @field_validator("templates")
    @classmethod
    def _one_slot(cls, value: Optional[tuple[str, ...]]) -> Optional[tuple[str, ...]]:
        if value is not None:
            check_templates(value)
        return value

    @field_validator("labels")
    @classmethod
    def _names(cls, value: Union[Path, tuple[str, ...]]) -> Union[Path, tuple[str, ...]]:
        return value if isinstance(value, Path) else check_labels(value)

    @property
    def prompts(self) -> tuple[str, ...]:
        """The templates the export uses (the defaults when none were given)."""
        return self.templates if self.templates is not None else DEFAULT_TEMPLATES


def check_templates(templates: tuple[str, ...]) -> tuple[str, ...]:
    """ValueError unless there is at least one template and each holds ``{}`` exactly once and no other brace."""
    if not templates:
        raise ValueError("at least one template, e.g. 'a photo of a {}.'")
    if len(templates) > MAX_TEMPLATES:
        raise ValueError(f"{len(templates)} templates; at most {MAX_TEMPLATES}")
    for t in templates:
        if t.count(SLOT) != 1 or t.replace(SLOT, "").count("{") or t.replace(SLOT, "").count("}"):
            raise ValueError(f"template {clip(t)} must hold '{{}}' exactly once (where the class name goes)")
    return templates


def check_labels(labels: tuple[str, ...], where: str = "") -> tuple[str, ...]:
    """ValueError unless there are at least two class names, unique, none blank (``where``: the file, named
    first in the message)."""
    names = tuple(labels)
    where = f"{where}: " if where else ""
    blank = [i for i, n in enumerate(names) if not n.strip()]
    if blank:
        raise ValueError(f"{where}class name {blank[0]} is blank")
    if len(names) < 2:
        raise ValueError(f"{where}{len(names)} class name(s); a classifier needs at least two")
    if len(names) > MAX_LABELS:
        raise ValueError(f"{where}{len(names)} class names; at most {MAX_LABELS}")
    seen: set[str] = set()
    twice = [n for n in names if n in seen or seen.add(n)]  # type: ignore[func-returns-value]
    if twice:
        raise ValueError(f"{where}the class name {clip(twice[0])} appears twice")
    return names


def read_labels(path: Path) -> tuple[str, ...]:
    """A labels file: one class name a line (surrounding spaces and blank lines dropped); ConfigError naming the
    file otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the labels file ({exc}); one class name a line, UTF-8") from None
    try:
        return check_labels(tuple(line.strip() for line in text.splitlines() if line.strip()), str(path))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def class_names(section: ZeroShotSection, base_dir: Path) -> tuple[str, ...]:
    """The class names ``section`` names: its list, or its labels file's lines (a relative path against
    ``base_dir``, the pipeline.yaml's folder)."""
    if isinstance(section.labels, Path):
        path = section.labels.expanduser()
        return read_labels(path if path.is_absolute() else base_dir / path)
    return section.labels


__all__ = ["DEFAULT_TEMPLATES", "ZeroShotSection", "check_labels", "check_templates", "class_names", "read_labels"]
