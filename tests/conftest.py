"""Shared fixtures: small checkpoints and tiny exports made here (no downloads), and the demo export."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

# Ray runs with its defaults: token authentication on for every cluster a test starts (RAY_AUTH_MODE unset),
# and every process of ours that joins one by address authenticates through vitdeploy/base/ray_join.py.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def pytest_configure(config):
    """The user's Ray token (~/.ray/auth_token) exists before any test starts a Ray, written whole once, as
    `vitdeploy serve` makes it: two clusters started at once (pytest-xdist workers, a test's `serve`
    subprocesses) then share one token instead of each writing its own over the other's."""
    from vitdeploy.base.ray_join import ensure_local_token

    ensure_local_token()


#: Fixtures that run a whole export: a test that needs one is marked ``integration`` (the fast run,
#: ``-m "not integration"``, never builds them).
WHOLE_EXPORTS = ("demo_artifacts", "drift_artifacts", "embedding_artifacts", "sized_artifacts")


def pytest_configure(config):
    """pytest-xdist hands out the files in the order collected (`pytest_collection_modifyitems`: the longest first),
    not its own (the files with the most tests first)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Every pytest-xdist worker must collect the same ids: an id spelled from raw bytes (a gzip header holds
    the time, for one) may differ between two workers' collections and fails the whole run, so it is refused.
    A test that needs a whole export and is not marked ``integration`` is refused too, by name. Under pytest-xdist
    the files come longest first (tests/helpers/schedule.py), so the two workers finish together."""
    raw = [item.nodeid for item in items if "\\x" in item.nodeid]
    if raw:
        raise pytest.UsageError(f"test ids spelled from raw bytes (give the parametrize ids=): {raw[0]}")
    unmarked = [
        item.nodeid
        for item in items
        if set(WHOLE_EXPORTS) & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("integration")
    ]
    if unmarked:
        needs = ", ".join(WHOLE_EXPORTS)
        raise pytest.UsageError(f"needs a whole export ({needs}) but is not marked integration: {unmarked[0]}")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects, and orders, the same
        from helpers.schedule import longest_first

        items[:] = longest_first(items)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """What ``build(folder)`` makes (it fills the empty ``folder`` and returns the path of what it made there), made
    once per test run: the pytest-xdist workers share the run's temp dir, and the first to ask builds under a lock
    while the others wait for it. Each worker then gets its own copy (``tmp_path_factory.mktemp(name)``), so a test
    that writes into it writes into its worker's copy alone, as when each worker built its own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's: popen-gw0 and popen-gw1 are beside each other in it
    shared = root / "built-once"
    shared.mkdir(exist_ok=True)
    made = shared / f"{name}.made"  # the path that build returned, written once it has returned
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a worker dies holding it
        if not made.exists():
            folder = shared / name
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that failed while building left
            folder.mkdir()
            made.write_text(str(build(folder).relative_to(folder)))
    source = shared / name / made.read_text()
    copy = tmp_path_factory.mktemp(name)
    shutil.copytree(source, copy, dirs_exist_ok=True)
    return copy


def _export(cfg_dict: dict, out: Path, **kwargs):
    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    cfg = parse_config(cfg_dict, None)
    return run_export(cfg, out, **kwargs)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A 32px, 2-block ViT with random weights saved in vitdeploy's own format."""
    import torch

    from vitdeploy.base.preprocess_spec import PreprocessSpec
    from vitdeploy.model import VisionTransformer, ViTConfig
    from vitdeploy.model.checkpoints import save_checkpoint

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, width=64, depth=2, heads=4, num_classes=7)
    model = VisionTransformer(cfg).eval()
    out = tmp_path_factory.mktemp("tiny_ckpt")
    save_checkpoint(out, model, [f"c{i}" for i in range(7)], PreprocessSpec(height=32, width=32), "tiny")
    return out


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory):
    """``tiny_artifacts(seed=0, fp16_copy=True) -> Path``: a complete tiny-ViT export directory
    (tests/helpers/tiny_export.py), built once per run for each (seed, fp16_copy) (`built_once`). Treat it as
    read-only: copy it before tampering with a file."""
    from helpers.tiny_export import build_tiny_artifacts

    built: dict[tuple[int, bool], Path] = {}

    def make(seed: int = 0, fp16_copy: bool = True) -> Path:
        if (seed, fp16_copy) not in built:
            name = f"tiny_seed{seed}" + ("" if fp16_copy else "_fp32")
            build = lambda folder: build_tiny_artifacts(folder, seed=seed, fp16_copy=fp16_copy)  # noqa: E731
            built[seed, fp16_copy] = built_once(tmp_path_factory, name, build)
        return built[seed, fp16_copy]

    return make


@pytest.fixture(scope="session")
def fused_vit(tmp_path_factory) -> Path:
    """A folder with a tiny ViT's model.onnx and model.ort.onnx (its attention fused: tests/helpers/tiny_export.py
    ``fused_tiny_vit``), built once per run (`built_once`). Read-only: write what a test makes elsewhere."""
    from helpers.tiny_export import fused_tiny_vit

    def build(folder: Path) -> Path:
        fused_tiny_vit(folder)
        return folder

    return built_once(tmp_path_factory, "fused_vit", build)


@pytest.fixture(scope="session")
def demo_artifacts(tmp_path_factory) -> Path:
    """The demo model exported once per test run (`built_once`; engine skipped: no TensorRT here).

    ``export.int8.min_speedup: 0``: model.int8.onnx ships whatever this machine's INT8 speed, so
    the tests that read it do not depend on a timing (the speed gate has its own tests)."""

    def build(out: Path) -> Path:
        _export({"export": {"int8": {"min_speedup": 0}}}, out, engine="skip")
        return out

    return built_once(tmp_path_factory, "demo_artifacts", build)


@pytest.fixture(scope="session")
def embedding_artifacts(tmp_path_factory) -> Path:
    """A headless checkpoint (a tiny transformers DINOv2 with registers, tests/helpers/tiny_export.py)
    exported once per test run (`built_once`): an embedding model (``output.kind: embedding``, EMBEDDINGS [batch, 64],
    no labels) with its patch tokens (``model.patch_tokens``: PATCH_TOKENS [batch, 16, 64], which every
    consumer answers only when asked); model.onnx and model.ort.onnx only (no FP16, INT8 or engine), ~10 s."""
    from helpers.tiny_export import save_headless_dinov2

    def build(folder: Path) -> Path:
        ckpt = save_headless_dinov2(folder / "checkpoint")
        export = {"batch": {"min": 1, "opt": 4, "max": 8}, "fp16": {"enabled": False}, "int8": {"enabled": False}}
        cfg = {"model": {"checkpoint": str(ckpt), "patch_tokens": True}, "export": export}
        _export(cfg, folder / "export", engine="skip")
        return folder / "export"

    return built_once(tmp_path_factory, "embedding_artifacts", build)


#: The square sides `sized_artifacts` answers at (56, the processor's crop, is its base size).
SIZED = (28, 42, 56)


@pytest.fixture(scope="session")
def sized_artifacts(tmp_path_factory) -> Path:
    """The tiny transformers DINOv2 with registers of `embedding_artifacts` exported once per test run for
    several sizes (``export.image_sizes: [28, 42, 56]``, patch 14; base 56): EMBEDDINGS [batch, 64] and
    PATCH_TOKENS [batch, (side / 14)^2, 64]; model.onnx and model.ort.onnx only."""
    from helpers.tiny_export import save_headless_dinov2

    def build(folder: Path) -> Path:
        ckpt = save_headless_dinov2(folder / "checkpoint")
        export = {
            "image_sizes": list(SIZED),
            "batch": {"min": 1, "opt": 4, "max": 8},
            "fp16": {"enabled": False},
            "int8": {"enabled": False},
        }
        validation = {"noise_samples": 4, "max_images": 4}
        cfg = {"model": {"checkpoint": str(ckpt), "patch_tokens": True}, "export": export, "validation": validation}
        _export(cfg, folder / "export", engine="skip")
        return folder / "export"

    return built_once(tmp_path_factory, "sized_artifacts", build)


@pytest.fixture(scope="session")
def export_config():
    """Build a validated PipelineConfig from a dict (no YAML file)."""
    from vitdeploy.base.config import parse_config

    return lambda data: parse_config(data, None)
