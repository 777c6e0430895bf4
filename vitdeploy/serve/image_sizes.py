"""The image size a request asks of an export for several sizes (export.image_sizes), on `vitdeploy serve`.

A request names one of the export's sizes with the request parameter :data:`IMAGE_SIZE_PARAM` (KServe v2
``"parameters": {"image_size": 336}`` over HTTP or gRPC, ``POST /predict?image_size=336``); without it the
export's base size answers. A replica keeps one Predictor per size asked (:meth:`Predictor.at_size`: the same
backend, that size's preprocessing) and never puts images of two sizes into one model call (:func:`by_shape`).
A size the export does not answer at is refused (400) naming the sizes that work. The sizes a server answers at
are stated in its v2 metadata and configuration (:data:`EXPORT_IMAGE_SIZES`, :func:`sizes_parameter`).
No Ray, no FastAPI here.
"""

from __future__ import annotations

import threading
from typing import Any, Hashable, Sequence

from ..base.errors import InputError, RequestError
from ..base.vocab import EXPORT_IMAGE_SIZES, IMAGE_SIZE_PARAM


def requested_size(value: Any, where: str = f"parameters.{IMAGE_SIZE_PARAM}") -> int | None:
    """The size a request asks for: None when ``value`` is absent (None or ""), else a positive whole number
    (an integer, or its decimal text as a query string or a gRPC string parameter carries it); RequestError
    naming ``where`` otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{where} must be a whole number of pixels (one of the export's sizes), got {value!r}")
    return value


def sizes_parameter(sizes: Sequence[int]) -> dict[str, str]:
    """``{EXPORT_IMAGE_SIZES: "28,42,56"}`` for an export for several sizes; {} for a fixed-size one."""
    return {EXPORT_IMAGE_SIZES: ",".join(str(int(s)) for s in sizes)} if sizes else {}


class SizedPredictors:
    """One replica's Predictor per size asked, made once each (:meth:`Predictor.at_size`, which shares the
    backend); thread-safe."""

    def __init__(self, predictor: Any) -> None:
        self.base = predictor
        self._lock = threading.Lock()
        self._by_size: dict[int, Any] = {}

    @property
    def patch_shape(self) -> tuple[int, int] | None:
        """(P, D) of the PATCH_TOKENS the metadata states: P is -1 (it follows the size asked) for an export for
        several sizes; None without patch tokens."""
        shape = self.base.patch_shape
        return None if shape is None else ((-1, shape[1]) if self.base.artifacts.image_sizes else tuple(shape))

    def at(self, size: int | None) -> Any:
        """The Predictor for ``size`` (None: the base one); RequestError (400) naming the sizes that work."""
        if size is None:
            return self.base
        with self._lock:
            found = self._by_size.get(size)
            if found is None:
                try:
                    found = self.base.at_size(size)
                except InputError as exc:
                    raise RequestError(f"{IMAGE_SIZE_PARAM}: {exc}") from None
                self._by_size[size] = found
            return found

    def for_side(self, side: int) -> Any:
        """The Predictor whose input is ``side`` pixels square (an image already preprocessed for it)."""
        return self.base if side == self.base.input_shape[-1] else self.at(side)


def by_shape(keys: Sequence[Hashable]) -> list[list[int]]:
    """The indices of ``keys`` grouped by equal key, each group in order, groups in order of first appearance:
    the model calls of one dynamic batch, one per image size."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


__all__ = ["SizedPredictors", "by_shape", "requested_size", "sizes_parameter"]
