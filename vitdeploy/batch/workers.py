"""What runs inside Ray Data: decoding tasks and the inference actors. Imported on Ray's workers.

:func:`decode_batch` turns a batch of encoded files into the model's input with the runtime's own
:class:`~vitdeploy.runtime.preprocess.Preprocessor` (built exactly as ``Predictor.preprocessor``
builds it: the manifest's spec, ``runtime.max_image_pixels``), so a row is bit for bit what
``predict`` answers. :class:`Infer` holds one Predictor for the life of the actor: its artifacts
arrive as a bundle from Ray's object store (or a URI) and are unpacked once per node, verified.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.vocab import EMBEDDING_DTYPES
from ..runtime.backends import first_line, shipped_roles

log = logging.getLogger(__name__)

#: An image that cannot be read is reported as ``<bytes>: reason``; the driver puts its path there.
BYTES_NAME = "<bytes>"


@dataclass(frozen=True)
class DecodeSpec:
    """What a decoding task needs: the manifest's preprocessing and the decompression-bomb limit."""

    preprocess: Any  # PreprocessSpec
    max_pixels: int


def decode_batch(batch: dict[str, np.ndarray], spec: DecodeSpec) -> dict[str, np.ndarray]:
    """``{"bytes", "path"}`` -> ``{"path", "pixels" (N, 3, H, W) float32, "error"}``; a bad image keeps
    zeros and its message, a good one an empty message (a column of strings survives Arrow, None does not)."""
    from ..runtime.preprocess import Preprocessor

    preprocessor = Preprocessor(spec.preprocess, max_pixels=spec.max_pixels)  # a few numbers: cheap per batch
    blobs = [bytes(b) for b in batch["bytes"]]
    pixels, good, errors = preprocessor.batch_tolerant(blobs)
    out = np.zeros((len(blobs), *preprocessor.output_shape), dtype=np.float32)
    if good:
        out[np.asarray(good)] = pixels
    messages = np.array([errors.get(i, "") for i in range(len(blobs))], dtype=object)  # "": read fine
    return {"path": batch["path"], "pixels": out, "error": messages}


@dataclass(frozen=True)
class InferSpec:
    """What an inference actor needs. ``source``: ``("bundle", [ObjectRef])``, ``("uri", "s3://...")`` or
    ``("folder", (path, manifest sha256, roles))`` (a worker on the driver's machine)."""

    source: tuple[str, Any]
    backend: str
    options: Any  # BackendOptions
    top_k: int
    cache_root: str | None = None
    embedding_dtype: str = EMBEDDING_DTYPES[0]  # an embedding export's vectors, as stored
    patch_tokens: bool = False  # an export with patch tokens: written beside each vector


class Infer:
    """One Predictor per actor: ``{"path", "pixels", "error"}`` -> the output rows (plus ``node``): a classifier's
    top-k, or an embedding export's vectors straight from the model's output array (no Python floats)."""

    def __init__(self, spec: InferSpec) -> None:
        import ray

        from ..runtime.artifact_transfer import fetch_uri, materialize, open_in_place
        from ..runtime.predictor import Predictor

        kind, where = spec.source
        if kind == "bundle":
            artifacts = materialize(ray.get(where[0]), spec.cache_root)
        elif kind == "folder":
            artifacts = open_in_place(*where)
        else:
            artifacts = fetch_uri(where, functools.partial(shipped_roles, spec.backend), spec.cache_root)
        self.predictor = Predictor.from_artifacts(artifacts, spec.backend, spec.options)
        self.top_k = spec.top_k
        self.embedding_dtype = spec.embedding_dtype
        self.patch_tokens = spec.patch_tokens
        self.node = ray.get_runtime_context().get_node_id()
        log.info("batch worker on node %s: %s (%s)", self.node, self.predictor.backend_name, self.predictor.why)

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        import pyarrow as pa

        errors = [str(e) for e in batch["error"]]
        good = [i for i, e in enumerate(errors) if not e]
        outputs = tokens = None
        if good:
            pixels = np.asarray(batch["pixels"], dtype=np.float32)
            outputs, tokens = self.predictor.predict_outputs(np.ascontiguousarray(pixels[good]), self.patch_tokens)
        paths = [str(p) for p in batch["path"]]
        reasons = [first_line(e) if e else None for e in errors]
        if self.predictor.is_embedding:
            table = self._vector_rows(paths, reasons, good, outputs, tokens)
        else:
            table = self._top_k_rows(paths, reasons, good, outputs)
        return table.append_column("node", pa.array([self.node] * table.num_rows, pa.string()))

    def _top_k_rows(self, paths: list[str], reasons: list[str | None], good: list[int], logits: Any) -> Any:
        import pyarrow as pa

        from .output import row_schema

        preds = dict(zip(good, self.predictor.predictions_from_logits(logits, self.top_k))) if good else {}
        rows: dict[str, list[Any]] = {name: [] for name in row_schema().names}
        for i, path in enumerate(paths):
            rec = preds[i].to_dict() if i in preds else {"error": reasons[i]}
            rows["path"].append(path)
            for key in ("label", "index", "score", "top_k", "error"):
                rows[key].append(rec.get(key))
        return pa.Table.from_pydict(rows, schema=row_schema())

    def _vector_rows(
        self, paths: list[str], reasons: list[str | None], good: list[int], vectors: Any, tokens: Any = None
    ) -> Any:
        """``path``, ``embedding`` (a fixed-size list, null for an unreadable image), ``patch_tokens`` (a fixed-size
        list of fixed-size lists, when asked for), ``error``: straight from the model's output arrays."""
        import pyarrow as pa

        from .output import row_schema

        dim, patches = self.predictor.output_width, self.predictor.patch_shape if self.patch_tokens else None
        schema = row_schema(dim, self.embedding_dtype, patches)
        dtype = schema.field("embedding").type.value_type.to_pandas_dtype()
        mask = pa.array([r is not None for r in reasons], pa.bool_())
        columns = [pa.array(paths, pa.string()), _fixed_lists(len(paths), good, vectors, (dim,), dtype, mask)]
        if patches is not None:
            columns.append(_fixed_lists(len(paths), good, tokens, patches, dtype, mask))
        return pa.Table.from_arrays([*columns, pa.array(reasons, pa.string())], schema=schema)


def _fixed_lists(rows: int, good: list[int], values: Any, shape: tuple[int, ...], dtype: Any, mask: Any) -> Any:
    """(rows, *shape) values as nested fixed-size lists (one level per dimension of ``shape``), ``good`` rows from
    ``values``, the others null (``mask``)."""
    import pyarrow as pa

    full = np.zeros((rows, *shape), dtype=dtype)
    if good:
        full[np.asarray(good)] = values
    column = pa.array(full.reshape(-1))
    for size in reversed(shape[1:]):
        column = pa.FixedSizeListArray.from_arrays(column, int(size))
    return pa.FixedSizeListArray.from_arrays(column, int(shape[0]), mask=mask)


__all__ = ["BYTES_NAME", "DecodeSpec", "decode_batch", "Infer", "InferSpec"]
