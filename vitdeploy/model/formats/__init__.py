"""Checkpoint formats: one place per format, registered once in :data:`READERS`.

``load_checkpoint`` resolves a path to a :class:`~.base.Source` (``resolve.py``: which format claims
its config file or its tensor names), then makes the same calls on that format's reader whatever
the format: ``convert_keys`` -> ``config`` -> ``labels`` -> ``preprocess`` -> ``native_input``/``antialias``.

Everything a format knows lives under its own name here: ``vitdeploy.py`` (our own, nothing to
convert), and a package for each format whose key conversion deserves its own file, as timm keeps a
model's ``checkpoint_filter_fn`` beside it: ``hf/``, ``timm/``, ``open_clip/``, ``torchvision/``, each an
``__init__.py`` holding the reader (detection, config, labels, preprocessing) and ``convert.py`` with
the pure functions it calls (key conversion, reading the library's config; tests call them directly).
What every format shares: ``base.py`` (the ``Reader`` interface), ``resolve.py`` (detection order) and
``shared.py`` (reading tensors safely, inferring the architecture from shapes, the ViT variants).

To add a format:

1. write ``model/formats/<format>.py`` (or ``<format>/__init__.py`` + ``<format>/convert.py``): a
   ``Reader`` subclass with ``format``, how it is detected (``meta_file`` + ``claims_meta`` for a
   config file beside the weights, ``claims_keys`` for a bare state dict), and the steps it needs;
2. add one line to ``READERS`` below (the order is the order detection asks);
3. if its config files state values, validate them in ``model/config_schema.py`` and test a
   round trip in ``tests/model/test_checkpoints.py``.

This package replaced ``model/readers/``, ``model/convert_*.py`` and the module ``model/formats.py``
(whose helpers are in ``shared.py`` now); the old paths import for one release, with a warning.
"""

from __future__ import annotations

from ...base.errors import CheckpointError
from .base import LoadOptions, ReadConfig, Reader, Source
from .hf import HFReader
from .open_clip import OpenClipReader
from .timm import TimmReader
from .torchvision import TorchvisionReader
from .vitdeploy import VitdeployReader

#: format name -> reader, in the order detection asks them (vitdeploy's own model.json first).
READERS: dict[str, Reader] = {
    r.format: r for r in (VitdeployReader(), HFReader(), TimmReader(), OpenClipReader(), TorchvisionReader())
}
FORMATS: tuple[str, ...] = tuple(READERS)


def reader_for(fmt: str) -> Reader:
    try:
        return READERS[fmt]
    except KeyError:
        raise CheckpointError(f"unsupported checkpoint format {fmt!r}; supported: {', '.join(FORMATS)}") from None


__all__ = ["FORMATS", "READERS", "LoadOptions", "ReadConfig", "Reader", "Source", "reader_for"]


def __getattr__(name: str):  # noqa: ANN202 - the module protocol
    """The helpers of the former module ``vitdeploy.model.formats``, for one release, with a warning."""
    import warnings

    from . import shared

    if name.startswith("_") or not hasattr(shared, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"vitdeploy.model.formats.{name} moved to vitdeploy.model.formats.shared.{name}; "
        "the old path goes away in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(shared, name)
