"""What an export's network returns, defined once: :class:`ModelOutput`.

A classifier returns logits (one per label); an embedding model returns the pooled feature vector,
exactly as the checkpoint's library pools it (the class token, transformers' ``pooler_output``, the mean
patch token), L2-normalised inside the graph when asked. Written by the export into model.json and the
manifest (``output``), read by the runtime (which output tensor, whether there are labels) and by every
judge (logits by top-k, vectors by cosine and neighbours). A manifest without the key is a classifier's.

On request (``model.patch_tokens``) an embedding export returns a second output, ``PATCH_TOKENS``
[batch, patches, width]: the tokens of the image patches after the backbone's final norm, exactly as the
library gives them (no class token, no registers, never L2-normalised), judged by cosine per token.

A classifier's ``scores`` says how its logits become the probabilities every consumer shows (predict's top-k,
served TOPK_SCORES, batch rows, flip details): ``softmax`` (a trained head, CLIP's zero-shot classifier) or
``sigmoid`` (each class on its own, SigLIP's zero-shot classifier: its scores do not sum to one). Computed
once, by ``runtime/postprocess.probabilities``.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, StrictBool, model_validator

from ._schema import StrictSection
from .errors import ConfigError
from .vocab import OUTPUT_TENSORS, PATCH_TOKENS, OutputKind, ScoreFunction

LOGITS, EMBEDDING = "logits", "embedding"


class ModelOutput(StrictSection):
    """The manifest's (and model.json's) ``output`` section."""

    kind: OutputKind = LOGITS
    normalize: StrictBool = Field(False, description="embedding: each vector L2-normalised inside the graph")
    patch_tokens: StrictBool = Field(
        False,
        description="embedding: a second output PATCH_TOKENS [batch, patches, width] (final-normed patch tokens)",
    )

    scores: ScoreFunction = Field(
        "softmax",
        description="logits: how they become probabilities: softmax (one distribution over the classes) or sigmoid "
        "(each class on its own, as SigLIP scores its zero-shot classes)",
    )

    @model_validator(mode="after")
    def _patch_tokens_of_embeddings(self) -> "ModelOutput":
        if self.patch_tokens and self.kind != EMBEDDING:
            raise ValueError("patch_tokens is an embedding's second output; kind is logits")
        if self.scores != "softmax" and self.kind == EMBEDDING:
            raise ValueError("scores apply to logits; an embedding has no probabilities")
        return self

    @property
    def tensor(self) -> str:
        """The graph's output name (and the served KServe v2 output)."""
        return OUTPUT_TENSORS[self.kind]

    @property
    def tensors(self) -> tuple[str, ...]:
        """Every output of the graph, in order: the pooled one, then PATCH_TOKENS when asked for."""
        return (self.tensor, PATCH_TOKENS) if self.patch_tokens else (self.tensor,)

    @property
    def is_embedding(self) -> bool:
        return self.kind == EMBEDDING

    def to_dict(self) -> dict[str, Any]:
        """As written into model.json, the manifest and the graphs' metadata: ``patch_tokens`` only when true and
        ``scores`` only when not softmax, so an export without them reads as before (and older runtimes, whose
        section has no such key, still open it; a sigmoid export they would misread is refused by them)."""
        data = self.model_dump()
        if not data["patch_tokens"]:
            del data["patch_tokens"]
        if data["scores"] == "softmax":
            del data["scores"]
        return data


def resolve_output(
    requested: str, normalize: bool, num_classes: int, where: Any, patch_tokens: bool = False, scores: str = "softmax"
) -> ModelOutput:
    """``model.output`` (auto / logits / embedding), ``model.normalize`` and ``model.patch_tokens`` against the
    checkpoint: auto is an embedding when the checkpoint has no classification head; logits without a head is
    refused (ConfigError naming the key and ``where``, the checkpoint), and so are normalize or patch_tokens
    with logits. ``scores``: the classifier's score function (a zero-shot head's, model/zero_shot.py)."""
    if requested == "auto":
        requested = LOGITS if num_classes else EMBEDDING
    if requested == LOGITS and not num_classes:
        raise ConfigError(
            f"model.output is logits but {where} has no classification head (a backbone); set model.output: "
            "embedding (or auto) to export its features"
        )
    if normalize and requested != EMBEDDING:
        raise ConfigError("model.normalize applies to embeddings; set model.output: embedding or drop it")
    if patch_tokens and requested != EMBEDDING:
        raise ConfigError(
            f"model.patch_tokens applies to embeddings, but {where} exports logits (it has a classification head); "
            "set model.output: embedding or drop model.patch_tokens"
        )
    scores = scores if requested == LOGITS else "softmax"
    return ModelOutput(kind=requested, normalize=normalize, patch_tokens=patch_tokens, scores=scores)


def output_of(data: Optional[dict[str, Any]]) -> ModelOutput:
    """The ``output`` section as written (None: a classifier's, as every export before embeddings)."""
    return ModelOutput.model_validate(data) if data is not None else ModelOutput()


__all__ = ["EMBEDDING", "LOGITS", "PATCH_TOKENS", "ModelOutput", "output_of", "resolve_output"]
