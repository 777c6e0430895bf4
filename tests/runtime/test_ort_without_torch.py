"""The ONNX Runtime path works on a machine without torch.

The artifacts and a test image are prepared here (with torch); a subprocess then runs with a
``sitecustomize`` that makes every ``import torch`` / ``import torch.*`` fail as if torch were not
installed, loads the artifacts on backend "ort", predicts, and reports what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from vitdeploy.runtime.auto_choice import cpu_candidates
from vitdeploy.runtime.predictor import Predictor

REPO = Path(__file__).resolve().parents[2]

HIDE_TORCH = '''
import sys

class _HideTorch:
    """Meta path finder that makes torch look uninstalled."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by test_no_torch)", name=name)
        return None

sys.meta_path.insert(0, _HideTorch())
'''

CHILD = """
import json, sys

try:
    import torch  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("torch was not hidden: the test would prove nothing")

from vitdeploy.base.errors import MissingDependencyError
from vitdeploy.runtime.predictor import Predictor

directory, image = sys.argv[1], sys.argv[2]
with Predictor.from_artifacts(directory, backend="ort") as p:
    preds = [x.to_dict() for x in p.predict(image, top_k=3)]
with Predictor.from_artifacts(directory) as auto:
    auto_name, auto_why = auto.backend_name, auto.why
try:
    Predictor.from_artifacts(directory, backend="torch")
    torch_error = None
except MissingDependencyError as exc:
    torch_error = str(exc)
print(json.dumps({"preds": preds, "auto": auto_name, "why": auto_why, "torch_error": torch_error,
                  "torch_loaded": "torch" in sys.modules,
                  "model_loaded": "vitdeploy.model" in sys.modules}))
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_artifacts):
    from PIL import Image

    root = tmp_path_factory.mktemp("notorch")
    directory = tiny_artifacts(seed=2)
    image = root / "cat.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (50, 40, 3), dtype=np.uint8)).save(image)
    hide = root / "hide_torch"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_TORCH)
    (root / "child.py").write_text(textwrap.dedent(CHILD))
    return directory, image, hide, root / "child.py"


def test_ort_predictor_runs_without_torch(prepared):
    directory, image, hide, child = prepared
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(REPO)])}
    out = subprocess.run(
        [sys.executable, str(child), str(directory), str(image)],
        env=env,
        cwd=hide,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])

    assert report["torch_loaded"] is False
    assert report["model_loaded"] is False
    # same answer as this (torch-enabled) process gives with the same artifacts
    with Predictor.from_artifacts(directory, backend="ort") as p:
        expected = p.predict(image, top_k=3)[0].to_dict()
    (got,) = report["preds"]
    assert (got["label"], got["index"]) == (expected["label"], expected["index"])
    assert got["score"] == pytest.approx(expected["score"], abs=1e-6)
    # auto-selection does not need torch either, and the torch backend says how to get it
    assert report["auto"] in ("ort-fp16", *cpu_candidates()) and report["auto"] != "torch"
    assert report["torch_error"] and "needs torch" in report["torch_error"]
    assert "pip install torch" in report["torch_error"]
