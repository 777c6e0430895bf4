"""Checkpoint formats, one reader each, behind one interface (:class:`~.base.Reader`).

``load_checkpoint`` resolves a path to a :class:`~.base.Source` (``resolve.py``: which reader claims
its config file or its tensor names), then makes the same calls on that format's reader whatever
the format: ``convert_keys`` -> ``config`` -> ``labels`` -> ``preprocess`` -> ``native_input``/``antialias``.

To add a format:

1. write ``model/readers/<format>.py``: a ``Reader`` subclass with ``format``, how it is detected
   (``meta_file`` + ``claims_meta`` for a config file beside the weights, ``claims_keys`` for a bare
   state dict), and the steps it needs (keep the key conversion a pure function, as
   ``convert_timm.py`` / timm's ``checkpoint_filter_fn``);
2. add one line to ``READERS`` below (the order is the order detection asks);
3. if its config files state values, validate them in ``model/config_schema.py`` and test a
   round trip in ``tests/model/test_checkpoints.py``.
"""

from __future__ import annotations

from ...base.errors import CheckpointError
from .base import LoadOptions, ReadConfig, Reader, Source
from .hf import HFReader
from .timm import TimmReader
from .torchvision import TorchvisionReader
from .vitdeploy import VitdeployReader

#: format name -> reader, in the order detection asks them (vitdeploy's own model.json first).
READERS: dict[str, Reader] = {r.format: r for r in (VitdeployReader(), HFReader(), TimmReader(), TorchvisionReader())}
FORMATS: tuple[str, ...] = tuple(READERS)


def reader_for(fmt: str) -> Reader:
    try:
        return READERS[fmt]
    except KeyError:
        raise CheckpointError(f"unsupported checkpoint format {fmt!r}; supported: {', '.join(FORMATS)}") from None


__all__ = ["FORMATS", "READERS", "LoadOptions", "ReadConfig", "Reader", "Source", "reader_for"]
