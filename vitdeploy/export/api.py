"""The export as a Python call: ``vitdeploy.export(model, output_dir, config)`` (the ``vitdeploy.export`` package
calls :func:`export_model`), what ``vitdeploy export`` runs too. docs/api.md documents it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..base.config import PipelineConfig, config_from
from ..base.errors import ConfigError
from .context import EngineMode, StageCallback
from .pipeline import ExportResult, run_export


def export_model(
    model: str | os.PathLike[str] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    config: PipelineConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    revision: str | None = None,
    engine: EngineMode = "auto",
    on_stage: StageCallback | None = None,
    sign_key: str | os.PathLike[str] | None = None,
) -> ExportResult:
    """Export ``model`` into ``output_dir`` as ``config`` asks; the export, its typed manifest in ``.manifest``.

    ``model``: a checkpoint file or folder (relative to the current folder), or a Hugging Face Hub name
    (``org/name[@revision]``, ``hf-hub:timm/<model>.<tag>``); None: the config's ``model.checkpoint`` (none
    there: the demo model). ``revision``: the Hub revision (as ``--revision``).
    ``output_dir``: None is the config's ``export.output_dir``.
    ``config``: a pipeline.yaml path, a mapping of its sections (relative paths in it against the current
    folder), a :class:`~vitdeploy.base.config.PipelineConfig`, or None: ``./pipeline.yaml`` where the current
    folder has one, else the defaults (as the CLI without ``-c``; ``{}`` is the defaults whatever the folder holds).
    ``engine``: the TensorRT engine where TensorRT and a CUDA GPU exist (``"auto"``), required (``"require"``:
    MissingDependencyError without them), or never (``"skip"``).
    ``on_stage``: called as each stage starts, runs (a heartbeat a second) and ends, with its
    :class:`~vitdeploy.export.context.StageRecord`.
    ``sign_key``: a PEM elliptic-curve private key: the export is signed once written (model.sig, `vitdeploy sign`).

    Raises the package's typed errors (``vitdeploy.base.errors``): ConfigError (the config, a model that
    names nothing), CheckpointError / HubError (the checkpoint), ExportError, ValidationError (an artifact
    drifted past ``validation.*``: ``output_dir`` keeps its previous export, with ``export-report.json`` and the
    ``*.rejected`` file beside it), MissingDependencyError, WriteError (the disk), and
    RefusedStagesError when a stage asked for explicitly could not be met: the export is written without its
    artifacts and the error's ``.result`` is this function's result.
    """
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise ConfigError(
            f"model: a checkpoint path or a Hub name (org/name[@revision]), got a {type(model).__name__}; "
            "save a module with vitdeploy.model.checkpoints.save_checkpoint and export that folder"
        )
    cfg = config_from(config).with_checkpoint(None if model is None else os.fspath(model), revision)
    return run_export(
        cfg,
        Path(output_dir) if output_dir is not None else None,
        engine=engine,
        on_stage=on_stage,
        sign_key=None if sign_key is None else Path(sign_key),
    )


__all__ = ["export_model"]
