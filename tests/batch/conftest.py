"""The batch room's fixtures: one small local Ray per module (an embedding model's real export is the root
conftest's ``embedding_artifacts``)."""

from __future__ import annotations

import shutil
import tempfile

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
