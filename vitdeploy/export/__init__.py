"""The export: a PyTorch ViT to validated ONNX graphs, TensorRT engines and a manifest (pipeline.py runs the
stage table).

The package is also the Python API's function (api.py)::

    vitdeploy.export(model, output_dir=None, config=None, *, revision=None, engine="auto", on_stage=None)

exports ``model`` (a checkpoint path or a Hub name; None: the config's model.checkpoint) into ``output_dir`` and
returns the :class:`~vitdeploy.export.pipeline.ExportResult`, its typed manifest in ``.manifest``
(docs/api.md). It is what ``vitdeploy export`` runs.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _ExportPackage(types.ModuleType):
    """``vitdeploy.export`` is a package and the function that runs an export: ``vitdeploy.export(...)`` calls
    :func:`vitdeploy.export.api.export_model`, however the package was imported."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .api import export_model

        return export_model(*args, **kwargs)


def __getattr__(name: str) -> Any:  # PEP 562: the call's signature for help() and notebooks, on first use
    if name == "__signature__":
        import inspect

        from .api import export_model

        return inspect.signature(export_model)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _ExportPackage
