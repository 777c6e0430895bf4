"""Today's preprocessing and eager FP32 model reproduce the committed golden numbers.

tests/data/golden/demo_logits.npz holds 16 demo images (paths), their preprocessed inputs and the
eager FP32 logits of the shipped demo weights, with the library versions that made them. A
dependency upgrade (torch, Pillow, numpy) that moves the numbers fails here, loudly, with the
versions then and now. If the change is expected, review it, then regenerate:

    .venv/bin/python scripts/make_golden_logits.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden" / "demo_logits.npz"
REGENERATE = (
    "if the change is expected, review it and regenerate with `.venv/bin/python scripts/make_golden_logits.py`"
)
INPUT_ATOL = 1e-6
LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module")
def golden() -> dict:
    assert GOLDEN.is_file(), f"{GOLDEN} is missing; create it with `.venv/bin/python scripts/make_golden_logits.py`"
    with np.load(GOLDEN) as data:
        return {k: data[k] for k in data.files}


def _now_versions() -> dict:
    import PIL
    import torch

    return {"numpy": np.__version__, "pillow": PIL.__version__, "torch": torch.__version__}


def _versions_note(golden: dict) -> str:
    then = json.loads(str(golden["versions"]))
    now = _now_versions()
    return "; ".join(f"{k} {then.get(k)} -> {v}" if then.get(k) != v else f"{k} {v}" for k, v in now.items())


@pytest.fixture(scope="module")
def demo_model():
    from vitdeploy.demo import DEMO_DIR as DEMO_MODEL_DIR

    meta = json.loads((DEMO_MODEL_DIR / "model.json").read_text(encoding="utf-8"))
    return DEMO_MODEL_DIR, meta


def test_golden_file_is_for_the_shipped_demo_weights(golden, demo_model):
    directory, _ = demo_model
    sha = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert str(golden["weights_sha256"]) == sha, (
        f"the demo weights changed ({directory / 'model.safetensors'} sha256 {sha[:12]}, golden file made from "
        f"{str(golden['weights_sha256'])[:12]}); {REGENERATE}"
    )
    assert len(golden["paths"]) >= 16 and golden["inputs"].shape[0] == golden["logits"].shape[0] == len(
        golden["paths"]
    )


def test_preprocessing_reproduces_the_golden_inputs(golden, demo_model):
    from vitdeploy.base.preprocess_spec import PreprocessSpec
    from vitdeploy.demo import IMAGES_DIR as DEMO_IMAGES_DIR
    from vitdeploy.runtime.preprocess import Preprocessor

    _, meta = demo_model
    now = Preprocessor(PreprocessSpec.from_dict(meta["preprocess"])).batch(
        [DEMO_IMAGES_DIR / str(p) for p in golden["paths"]]
    )
    assert now.shape == golden["inputs"].shape and now.dtype == np.float32
    diff = float(np.abs(now - golden["inputs"]).max())
    assert diff <= INPUT_ATOL, (
        f"preprocessing moved: max abs diff {diff:.3g} > {INPUT_ATOL:g} against {GOLDEN.name} "
        f"({_versions_note(golden)}); a Pillow/numpy change alters the pixels every backend sees; {REGENERATE}"
    )


def test_eager_torch_reproduces_the_golden_logits(golden, demo_model):
    import torch

    from vitdeploy.runtime.backends.torch_backend import TorchBackend

    directory, meta = demo_model
    vit = meta["vit"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as when the golden file was made
    backend = TorchBackend(directory, (vit.get("in_channels", 3), vit["image_size"], vit["image_size"]))
    try:
        logits = backend.run(np.ascontiguousarray(golden["inputs"]))
    finally:
        backend.close()
        torch.set_num_threads(threads)
    diff = float(np.abs(logits - golden["logits"]).max())
    assert diff <= LOGIT_ATOL, (
        f"eager FP32 logits moved: max abs diff {diff:.3g} > {LOGIT_ATOL:g} against {GOLDEN.name} "
        f"({_versions_note(golden)}); {REGENERATE}"
    )
    assert (logits.argmax(1) == golden["logits"].argmax(1)).all()


@pytest.mark.integration  # the demo export
def test_the_exported_torch_backend_matches_the_golden_logits(golden, demo_artifacts):
    """Export keeps the demo weights bit-for-bit: its torch backend gives the golden logits."""
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import open_backend

    backend = open_backend("torch", Artifacts.open(demo_artifacts))
    try:
        logits = backend.run(np.ascontiguousarray(golden["inputs"]))
    finally:
        backend.close()
    diff = float(np.abs(logits - golden["logits"]).max())
    assert diff <= LOGIT_ATOL, f"the exported weights give logits {diff:.3g} away from the golden ones; {REGENERATE}"
