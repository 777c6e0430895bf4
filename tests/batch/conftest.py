"""The batch room's fixtures: one small local Ray per module, and an embedding model's real export."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """One small local Ray for the module (a short private temp dir: Ray's socket paths are length-limited)."""
    ray = pytest.importorskip("ray")
    import ray.data

    temp = tempfile.mkdtemp(prefix="vb", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def embedding_artifacts(tmp_path_factory) -> Path:
    """A headless checkpoint exported for real: a tiny transformers Dinov2WithRegistersModel (random weights,
    save_pretrained, a BitImageProcessor config beside it), so ``model.output: auto`` makes it an embedding
    export (64 values a row, no labels). ~10 s."""
    transformers = pytest.importorskip("transformers")
    import torch

    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    torch.manual_seed(0)
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14, num_register_tokens=4
    )
    checkpoint = tmp_path_factory.mktemp("dinoreg")
    transformers.Dinov2WithRegistersModel(config).eval().save_pretrained(checkpoint)
    transformers.BitImageProcessor(
        size={"shortest_edge": 64},
        crop_size={"height": 56, "width": 56},
        do_center_crop=True,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(checkpoint)
    out = tmp_path_factory.mktemp("embedding_artifacts")
    cfg = parse_config({"model": {"checkpoint": str(checkpoint)}, "export": {"batch": {"min": 1, "opt": 4, "max": 8}}})
    run_export(cfg, out, engine="skip")
    return out
