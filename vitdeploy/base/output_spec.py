"""What an export's network returns, defined once: :class:`ModelOutput`.

A classifier returns logits (one per label); an embedding model returns the pooled feature vector,
exactly as the checkpoint's library pools it (the class token, transformers' ``pooler_output``, the mean
patch token), L2-normalised inside the graph when asked. Written by the export into model.json and the
manifest (``output``), read by the runtime (which output tensor, whether there are labels) and by every
judge (logits by top-k, vectors by cosine and neighbours). A manifest without the key is a classifier's.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, StrictBool

from ._schema import StrictSection
from .errors import ConfigError
from .vocab import OUTPUT_TENSORS, OutputKind

LOGITS, EMBEDDING = "logits", "embedding"


class ModelOutput(StrictSection):
    """The manifest's (and model.json's) ``output`` section."""

    kind: OutputKind = LOGITS
    normalize: StrictBool = Field(False, description="embedding: each vector L2-normalised inside the graph")

    @property
    def tensor(self) -> str:
        """The graph's output name (and the served KServe v2 output)."""
        return OUTPUT_TENSORS[self.kind]

    @property
    def is_embedding(self) -> bool:
        return self.kind == EMBEDDING


def resolve_output(requested: str, normalize: bool, num_classes: int, where: Any) -> ModelOutput:
    """``model.output`` (auto / logits / embedding) and ``model.normalize`` against the checkpoint: auto is an
    embedding when the checkpoint has no classification head; logits without a head is refused (ConfigError
    naming the key and ``where``, the checkpoint)."""
    if requested == "auto":
        requested = LOGITS if num_classes else EMBEDDING
    if requested == LOGITS and not num_classes:
        raise ConfigError(
            f"model.output is logits but {where} has no classification head (a backbone); set model.output: "
            "embedding (or auto) to export its features"
        )
    if normalize and requested != EMBEDDING:
        raise ConfigError("model.normalize applies to embeddings; set model.output: embedding or drop it")
    return ModelOutput(kind=requested, normalize=normalize)


def output_of(data: Optional[dict[str, Any]]) -> ModelOutput:
    """The ``output`` section as written (None: a classifier's, as every export before embeddings)."""
    return ModelOutput.model_validate(data) if data is not None else ModelOutput()


__all__ = ["EMBEDDING", "LOGITS", "ModelOutput", "output_of", "resolve_output"]
