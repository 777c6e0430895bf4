"""A zero-shot classifier compiled into one image-only network: the checkpoint's own text tower runs once, here,
at export time, in its library; what it computes is baked into the image tower's head; the text tower never
ships.

For each class name, every prompt template (``base/zero_shot_spec.py``) is tokenised by the checkpoint's own
tokenizer and embedded by the library (transformers ``CLIPModel.get_text_features`` /
``SiglipModel.get_text_features``); each prompt's embedding is L2-normalised, the class's are averaged and the
mean normalised again (CLIP's prompt ensembling). The network the export runs is then

    logits = logit_scale * normalize(image_embedding) @ classes.T (+ logit_bias)

as the library's ``logits_per_image``: the image tower's embedding (``get_image_features``), L2-normalised
(``ViTConfig.head_l2norm``), through a head whose weight is ``logit_scale x`` the class embeddings and whose bias
is SigLIP's ``logit_bias`` (zero for CLIP). CLIP's probabilities are a softmax over the classes, SigLIP's a
sigmoid per class (``ModelOutput.scores``), as transformers' zero-shot-image-classification pipeline computes
them. Tokenisation follows that pipeline too: CLIP pads to the longest prompt; SigLIP pads to
``max_length=64`` (what SigLIP was trained with; its text tower pools the last position).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base._deps import require
from ..base.errors import CheckpointError, MissingDependencyError
from ..base.zero_shot_spec import ZeroShotSection, class_names

log = logging.getLogger(__name__)

#: transformers model types with a text tower whose ``get_text_features`` embeds prompts -> (score function,
#: tokenizer arguments as transformers' zero-shot-image-classification pipeline passes them)
TEXT_TOWERS: dict[str, tuple[str, dict[str, Any]]] = {
    "clip": ("softmax", {"padding": True}),
    "siglip": ("sigmoid", {"padding": "max_length", "max_length": 64, "truncation": True}),
}
#: prompts embedded in one call of the text tower
TEXT_BATCH = 256
#: an OpenCLIP checkpoint's config (its text tower runs in open_clip, where that package is installed)
OPEN_CLIP_CONFIG = "open_clip_config.json"
#: a tokenizer's vocabulary file, one of which a checkpoint folder must hold (transformers would otherwise build a
#: tokenizer of three special tokens from config.json alone, and every prompt would embed the same)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")
#: what a Hub checkpoint's zero-shot export fetches beside the weights (those the repo has), at the same commit
TOKENIZER_FETCH = (
    *TOKENIZER_FILES,
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


@dataclass(frozen=True)
class TextClasses:
    """What the text tower gave: one L2-normalised embedding per class, the logit scale and bias, how to score."""

    labels: tuple[str, ...]
    templates: tuple[str, ...]
    embeddings: Any  # torch.Tensor (classes, width), float32, each row of unit length
    logit_scale: float  # exp(logit_scale) of the checkpoint: what multiplies the cosines
    logit_bias: float | None  # SigLIP's, added to every logit; None for CLIP
    scores: str  # softmax (CLIP) or sigmoid (SigLIP): vocab.SCORE_FUNCTIONS
    text_model: dict[str, Any] = field(default_factory=dict)  # which library, class, tokenizer, padding

    def record(self, source: str) -> dict[str, Any]:
        """The manifest's ``zero_shot``: what was baked into the graph and where it came from."""
        import numpy as np

        data = np.ascontiguousarray(self.embeddings.detach().cpu().numpy(), dtype="<f4").tobytes()
        return {
            "labels": list(self.labels),
            "templates": list(self.templates),
            "ensembling": "each prompt's text embedding L2-normalised, averaged per class, normalised again",
            "scores": self.scores,
            "logit_scale": self.logit_scale,
            "logit_bias": self.logit_bias,
            "embedding_width": int(self.embeddings.shape[1]),
            "class_embeddings_sha256": hashlib.sha256(data).hexdigest(),
            "text_model": {**self.text_model, "checkpoint": source},
            "ships": "the class embeddings, scale and bias in the head of the image graph; no text weights",
        }


def checkpoint_folder(path: Path) -> Path:
    """The folder that holds a checkpoint's config.json and tokenizer (``path``, or its folder for a file)."""
    return path if path.is_dir() else path.parent


def text_classes(folder: Path, labels: tuple[str, ...], templates: tuple[str, ...]) -> TextClasses:
    """Run ``folder``'s text tower (a transformers CLIP / SigLIP checkpoint with both towers, and its tokenizer)
    over every class's prompts; CheckpointError naming the folder when it has no text tower to run."""
    if (folder / OPEN_CLIP_CONFIG).is_file():
        return _open_clip_classes(folder, labels, templates)
    torch = require("torch", "a zero-shot classifier's class embeddings")
    transformers = require("transformers", "a zero-shot classifier's class embeddings (the checkpoint's text tower)")
    model_type = _model_type(folder)
    scores, token_args = TEXT_TOWERS[model_type]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"{folder}: no tokenizer beside the checkpoint (none of {', '.join(TOKENIZER_FILES)}); a zero-shot "
            "export tokenises the prompts with the checkpoint's own tokenizer (save it there: save_pretrained)"
        )
    bars = transformers.utils.logging
    shown = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()  # the export's console has its own progress line
    try:
        model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except ImportError as exc:  # SigLIP's SentencePiece tokenizer without the sentencepiece package
        raise MissingDependencyError(
            f"{folder}: its tokenizer needs a package that is missing ({_first(exc)}); e.g. pip install sentencepiece"
        ) from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{folder}: cannot load its text tower or tokenizer with transformers ({_first(exc)}); a zero-shot "
            "export needs the whole CLIP / SigLIP checkpoint: both towers and the tokenizer files"
        ) from exc
    finally:
        if shown:
            bars.enable_progress_bar()
    if not hasattr(model, "get_text_features"):
        raise CheckpointError(f"{folder}: {type(model).__name__} has no text tower (get_text_features)")
    model.eval()
    with torch.inference_mode():
        embeddings = _class_embeddings(
            lambda texts: _text_features(model, tokenizer(texts, return_tensors="pt", **token_args)), labels, templates
        )
        scale = float(model.logit_scale.exp())
        bias = float(model.logit_bias) if scores == "sigmoid" else None
    log.info("%s: %d classes x %d templates embedded by %s", folder, len(labels), len(templates), type(model).__name__)
    text_model = {
        "library": "transformers",
        "version": transformers.__version__,
        "class": type(model).__name__,
        "method": "get_text_features",
        "model_type": model_type,
        "tokenizer": type(tokenizer).__name__,
        "tokenizer_args": token_args,
    }
    return TextClasses(labels, templates, embeddings, scale, bias, scores, text_model)


def _text_features(model: Any, tokens: Any) -> Any:
    out = model.get_text_features(**tokens)
    return out if hasattr(out, "shape") else out.pooler_output  # transformers 5: an output object


def _open_clip_classes(folder: Path, labels: tuple[str, ...], templates: tuple[str, ...]) -> TextClasses:
    """An OpenCLIP checkpoint (``open_clip_config.json``): its text tower and tokenizer as open_clip builds them
    (``create_model('local-dir:...')``, ``get_tokenizer``), ``encode_text``; a logit bias makes it SigLIP's
    (sigmoid scores)."""
    torch = require("torch", "a zero-shot classifier's class embeddings")
    open_clip = require("open_clip", f"{folder}: an OpenCLIP checkpoint's text tower (pip install open-clip-torch)")
    try:
        model = open_clip.create_model(f"local-dir:{folder}").eval()
        tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{folder}: open_clip cannot build its model or tokenizer ({_first(exc)})") from exc
    with torch.inference_mode():
        embeddings = _class_embeddings(lambda texts: model.encode_text(tokenizer(texts)), labels, templates)
        scale = float(model.logit_scale.exp())
        bias = getattr(model, "logit_bias", None)
        bias = float(bias) if bias is not None else None
    text_model = {
        "library": "open_clip",
        "version": str(getattr(open_clip, "__version__", "")),
        "class": type(model).__name__,
        "method": "encode_text",
        "tokenizer": type(tokenizer).__name__,
    }
    return TextClasses(
        labels, templates, embeddings, scale, bias, "sigmoid" if bias is not None else "softmax", text_model
    )


def _model_type(folder: Path) -> str:
    """config.json's model_type, when it is one of :data:`TEXT_TOWERS`; CheckpointError otherwise."""
    import json

    config = folder / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type not in TEXT_TOWERS:
        found = f"model_type {model_type!r}" if model_type else "no transformers config.json"
        raise CheckpointError(
            f"{folder}: a zero-shot classifier needs the checkpoint's text tower: a transformers "
            f"{' / '.join(TEXT_TOWERS)} checkpoint with both towers and its tokenizer (CLIPModel, SiglipModel); "
            f"found {found}. An image tower alone exports as an embedding model (drop --labels)"
        )
    return model_type


def _class_embeddings(encode: Any, labels: tuple[str, ...], templates: tuple[str, ...]) -> Any:
    """(classes, width): each class's prompts' text embeddings (``encode``: texts -> the library's features)
    L2-normalised, averaged, normalised again (CLIP's way); the prompts embedded :data:`TEXT_BATCH` at a time,
    whatever class they belong to (CLIP reads the end token under a causal mask, SigLIP pads every prompt to its
    length: a prompt's embedding does not depend on its batch)."""
    import torch

    prompts = [template.format(name) for name in labels for template in templates]
    parts = [encode(prompts[i : i + TEXT_BATCH]).float() for i in range(0, len(prompts), TEXT_BATCH)]
    unit = torch.nn.functional.normalize(torch.cat(parts), dim=-1)
    mean = unit.reshape(len(labels), len(templates), -1).mean(dim=1)
    return mean / mean.norm(dim=-1, keepdim=True)


def bake(model: Any, classes: TextClasses, where: Path) -> Any:
    """``model`` (an image tower: a VisionTransformer without a classification head, whose pooled output is the
    embedding the text embeddings live beside) given a zero-shot head, in place: the embedding L2-normalised,
    then ``logit_scale x`` the class embeddings, plus the logit bias. Returns ``model``."""
    torch = require("torch", "a zero-shot classifier")

    cfg = model.cfg
    if cfg.num_classes:
        raise CheckpointError(
            f"{where}: the image tower already has a {cfg.num_classes}-class head; a zero-shot classifier is "
            "compiled from a tower whose output is its embedding (drop --labels / model.zero_shot)"
        )
    count, width = (int(n) for n in classes.embeddings.shape)
    if width != cfg.pooled_width:
        raise CheckpointError(
            f"{where}: the text tower embeds into {width} dimensions but the image tower returns {cfg.pooled_width}; "
            "they are not one contrastive model's two towers"
        )
    head = torch.nn.Linear(width, count)
    with torch.no_grad():
        head.weight.copy_(classes.logit_scale * classes.embeddings.float())
        head.bias.fill_(classes.logit_bias or 0.0)
    model.cfg = cfg.replace(num_classes=count, head_l2norm=True)
    model.head = head
    return model.eval()


def compile_zero_shot(loaded: Any, section: ZeroShotSection, base_dir: Path, source: Path) -> tuple[Any, dict]:
    """The loaded checkpoint as a zero-shot classifier (``model.zero_shot``): its model baked, its labels the
    class names, a note saying what was done; and the manifest's ``zero_shot`` record. ``source``: the
    checkpoint's path (a Hub checkpoint's snapshot folder)."""
    from dataclasses import replace

    if loaded.hub is not None:  # the tokenizer's files, from the commit the weights came from
        from .hub.fetch import fetch_more

        loaded = replace(loaded, hub=fetch_more(loaded.hub, TOKENIZER_FETCH))
    folder = checkpoint_folder(source)
    labels = class_names(section, base_dir)
    classes = text_classes(folder, labels, section.prompts)
    baked = bake(loaded.model, classes, folder)
    bias = f", logit bias {classes.logit_bias:.4g}" if classes.logit_bias is not None else ""
    note = (
        f"zero-shot: {len(labels)} classes x {len(classes.templates)} prompt templates embedded once by "
        f"{classes.text_model['class']}.get_text_features ({classes.text_model['tokenizer']}); logit scale "
        f"{classes.logit_scale:.4g}{bias}, {classes.scores} scores; the text tower is not exported"
    )
    shown = loaded.hub.pinned if loaded.hub is not None else str(source)
    compiled = replace(loaded, model=baked, config=baked.cfg, labels=labels, notes=(*loaded.notes, note))
    return compiled, classes.record(shown)


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


__all__ = ["TEXT_TOWERS", "TextClasses", "bake", "checkpoint_folder", "compile_zero_shot", "text_classes"]
