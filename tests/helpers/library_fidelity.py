"""The library-fidelity tests' shared pieces (tests/model/test_checkpoints_library_fidelity.py and
tests/model/test_vit_family.py): real photos as files, the reference run in ``.venv-ref``
(tests/helpers/library_reference.py), vitdeploy's export and prediction of a checkpoint, and the
comparisons with their tolerances.

Importing it skips the importing test module where scikit-image is missing (the photos come from it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitdeploy.base.config import parse_config
from vitdeploy.export.pipeline import run_export
from vitdeploy.runtime.postprocess import softmax
from vitdeploy.runtime.predictor import Predictor

REPO = Path(__file__).resolve().parents[2]
REFERENCE_SCRIPT = Path(__file__).resolve().parent / "library_reference.py"
PIXEL_TOL = 1e-5
LOGIT_TOL = 1e-4
PROB_TOL = 1e-4

skdata = pytest.importorskip("skimage.data", reason="scikit-image not installed (pip install scikit-image)")

# --------------------------------------------------------------------------- photos and the reference run


@pytest.fixture(scope="session")
def photos(tmp_path_factory) -> Path:
    """Real photos as files, square, landscape and portrait, JPEG and PNG (sorted by name = reference order)."""
    out = tmp_path_factory.mktemp("photos")
    astronaut, chelsea, coffee, rocket = (
        Image.fromarray(getattr(skdata, n)()) for n in ("astronaut", "chelsea", "coffee", "rocket")
    )
    astronaut.save(out / "a_astronaut_512x512.png")
    chelsea.save(out / "b_chelsea_451x300.jpg", quality=92)
    coffee.save(out / "c_coffee_600x400.jpg", quality=92)
    rocket.save(out / "d_rocket_640x427.jpg", quality=92)
    coffee.transpose(Image.Transpose.ROTATE_90).save(out / "e_coffee_400x600.png")
    astronaut.crop((150, 0, 350, 512)).save(out / "f_astronaut_200x512.jpg", quality=92)
    return out


def photo_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".jpg", ".png"))


def reference_python() -> Path:
    return Path(os.environ.get("VITDEPLOY_REF_PYTHON") or REPO / ".venv-ref" / "bin" / "python")


def run_reference(photos: Path, out: Path, *groups: str) -> dict:
    """Run tests/helpers/library_reference.py (optionally one group of cases) into ``out``: its cases.
    Skips (one line) without the reference environment, except in CI, where that fails."""
    python = reference_python()
    if not python.exists():
        reason = f"reference environment missing ({python}): run `make reference-env` (timm, torchvision)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason + "; CI must build it")
        pytest.skip(reason)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONPATH": "",
        "CUDA_VISIBLE_DEVICES": "",
    }
    proc = subprocess.run(
        [str(python), str(REFERENCE_SCRIPT), str(photos), str(out), *groups],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, f"reference script failed:\n{proc.stderr[-4000:]}"
    cases = json.loads((out / "cases.json").read_text())
    assert cases["photos"] == [p.name for p in photo_files(photos)]
    return cases["cases"]


# --------------------------------------------------------------------------- ours


def export(checkpoint: Path, photos: Path, out: Path, **sections) -> tuple[Path, dict]:
    """vitdeploy export of ``checkpoint`` (small validation run; no TensorRT here) -> (folder, manifest)."""
    data = {
        "model": {"checkpoint": str(checkpoint), **sections.pop("model", {})},
        "validation": {"images": str(photos), "noise_samples": 2},
        "export": {"batch": {"min": 1, "opt": 2, "max": 4}},
        **sections,
    }
    run_export(parse_config(data, None), out, engine="skip", validation_batch=(1, 4))
    return out, json.loads((out / "manifest.json").read_text())


def predict(artifacts: Path, photos: Path, backend: str = "ort") -> tuple[np.ndarray, np.ndarray]:
    """(pixels, logits) of the exported model on the photo files, as `vitdeploy predict` computes them."""
    with Predictor.from_artifacts(artifacts, backend=backend) as predictor:
        pixels = predictor.preprocess(photo_files(photos))
        return pixels, predictor.predict_logits(pixels)


def assert_same_predictions(
    logits: np.ndarray, ref_logits: np.ndarray, logit_tol: float = LOGIT_TOL, prob_tol: float = PROB_TOL
) -> None:
    assert logits.shape == ref_logits.shape
    assert float(np.abs(logits - ref_logits).max()) <= logit_tol
    assert (logits.argmax(1) == ref_logits.argmax(1)).all()
    assert float(np.abs(softmax(logits) - softmax(ref_logits)).max()) <= prob_tol


def assert_pixels(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape, what
    diff = float(np.abs(ours - theirs).max())
    assert diff <= PIXEL_TOL, f"{what}: max |pixel diff| {diff}"
