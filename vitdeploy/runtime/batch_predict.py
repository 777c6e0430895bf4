"""Classify many image files in batches; an unreadable image becomes an error record, never a stop.

for rec in predict_paths(predictor, ["photos/", "extra.jpg"], batch_size=32):
    print(json.dumps(rec))   # {"path", "label", "index", "score", "top_k": [...]} or {"path", "error"}
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..base.errors import InputError
from ..base.limits import check_batch_size

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


def predict_paths(
    predictor: Any,
    paths: Iterable[str | os.PathLike[str]],
    *,
    batch_size: int = 32,
    top_k: int = 5,
    progress: Progress | None = None,
    patch_tokens: bool = False,
) -> Iterator[dict[str, Any]]:
    """One record per image file under ``paths`` (files as given, directories walked), in order.

    Paths are expanded before this returns; a path that cannot be used (missing, a symlink loop,
    an unreadable or empty directory) yields its own error record in place and the others are
    predicted. Every image file yields exactly one record. ``progress(done, total)`` is called
    after each batch. ``patch_tokens``: an embedding's records carry its patch tokens too (InputError when the
    export has none).
    """
    batch_size = check_batch_size(batch_size, "batch_size")
    if int(top_k) < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    if patch_tokens:
        predictor.check_patch_tokens()
    from .image_paths import expand_image_paths

    return _records(predictor, expand_image_paths(paths), int(batch_size), int(top_k), progress, patch_tokens)


def _records(
    predictor: Any,
    entries: list[tuple[Path, str | None]],
    batch_size: int,
    top_k: int,
    progress: Progress | None,
    patch_tokens: bool = False,
) -> Iterator[dict[str, Any]]:
    total, done = len(entries), 0
    preprocessor = predictor.preprocessor
    start = 0
    while start < total:
        while start < total and entries[start][1] is not None:  # a bad path: its record, in place
            path, error = entries[start]
            log.debug("skipping %s: %s", path, error)
            yield {"path": str(path), "error": error}
            start += 1
            done += 1
        end = start
        while end < total and end - start < batch_size and entries[end][1] is None:
            end += 1
        if end == start:  # only bad paths were left
            if progress is not None:
                progress(done, total)
            break
        chunk = [p for p, _ in entries[start:end]]
        start = end
        batch, good, errors = preprocessor.batch_tolerant(chunk)
        good = [int(i) for i in good]
        preds = {}
        if good and batch is not None:
            logits, tokens = predictor.predict_outputs(batch, patch_tokens)
            preds = dict(zip(good, predictor.predictions_from_logits(logits, top_k, tokens)))
        for i, path in enumerate(chunk):
            if i in preds:
                yield {"path": str(path), **preds[i].to_dict()}
            else:
                message = str(errors.get(i, "image could not be preprocessed"))
                log.debug("skipping %s: %s", path, message)
                yield {"path": str(path), "error": message}
        done += len(chunk)
        if progress is not None:
            progress(done, total)
