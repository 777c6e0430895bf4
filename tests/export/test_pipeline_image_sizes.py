"""export.image_sizes: one export of a tiny DINOv2 with registers answering at several sizes, each artifact
judged against eager PyTorch at every size; the runtime at a listed size, a size not listed refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_export import save_headless_dinov2

from vitdeploy.base.errors import InputError

pytestmark = pytest.mark.integration

SIZES = [28, 56, 70]


@pytest.fixture(scope="module")
def sized_export(tmp_path_factory, export_config) -> Path:
    from vitdeploy.export.pipeline import run_export

    tmp = tmp_path_factory.mktemp("sizes")
    config = export_config(
        {
            "model": {"checkpoint": str(save_headless_dinov2(tmp / "ck"))},
            "export": {"image_sizes": SIZES, "batch": {"min": 1, "opt": 2, "max": 4}, "int8": {"enabled": False}},
            "validation": {"noise_samples": 4, "max_images": 4},
        }
    )
    return run_export(config, tmp / "out", engine="skip").manifest_path.parent


def test_every_artifact_is_validated_at_every_listed_size(sized_export: Path):
    manifest = json.loads((sized_export / "manifest.json").read_text())
    assert manifest["image_sizes"]["sizes"] == SIZES
    assert manifest["io"]["input"]["shape"] == ["batch", 3, 56, 56]  # the processor's crop: the base size
    recipes = manifest["image_sizes"]["preprocess"]
    assert (recipes["70"]["height"], recipes["70"]["shortest_edge"]) == (70, 80)  # 64/56 of the crop, kept
    for gate in ("validate-onnx", "validate-ort-optimized", "validate-fp16"):
        per_size = manifest["validation"][gate]["per_size"]
        assert sorted(per_size) == ["28", "70"] and all(v["passed"] for v in per_size.values()), gate
    assert manifest["validation"]["validate-onnx"]["per_size"]["70"]["metrics"]["max_abs_diff"] < 1e-4


def test_ort_graph_fuses_every_blocks_attention_with_dynamic_height_and_width(sized_export: Path, tmp_path):
    """The head reshapes' shapes are computed in the graph (Shape/Concat of the token count), yet each of
    the 2 blocks gets one MultiHeadAttention (the graph validated at every size above); a wrong head count
    is still refused."""
    from vitdeploy.export.optimize import fused_op_counts, optimize_for_ort

    assert fused_op_counts(sized_export / "model.ort.onnx").get("MultiHeadAttention") == 2
    out = optimize_for_ort(sized_export / "model.onnx", tmp_path / "m.ort.onnx", num_heads=4, hidden_size=64)
    assert "MultiHeadAttention" not in fused_op_counts(out)


def test_runtime_answers_at_a_listed_size_as_eager_and_refuses_another(sized_export: Path):
    import torch

    from vitdeploy.model import load_checkpoint
    from vitdeploy.runtime.predictor import Predictor

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(90, 120, 3), dtype=np.uint8)
    eager = load_checkpoint(sized_export)  # the export's own model.json: runs at any size too
    with Predictor.from_artifacts(sized_export, backend="ort") as base:
        at70 = base.at_size(70)
        batch = at70.preprocess([image])
        assert batch.shape == (1, 3, 70, 70)
        with torch.no_grad():
            want = eager.model.forward_features(torch.from_numpy(batch)).numpy()
        assert np.abs(at70.embed(batch) - want).max() < 1e-4
        with pytest.raises(InputError, match="sizes that work: 28, 56, 70"):
            base.at_size(42)
        with pytest.raises(InputError, match="one of 28x28, 56x56, 70x70"):
            base.backend.run(np.zeros((1, 3, 42, 42), np.float32))


def test_a_fixed_size_export_names_its_one_size(tiny_artifacts):
    from vitdeploy.runtime.predictor import Predictor

    with Predictor.from_artifacts(tiny_artifacts(), backend="ort") as predictor:
        with pytest.raises(InputError, match="sizes that work: 32$"):
            predictor.at_size(64)


def test_tensorrt_profile_spans_the_sizes_with_the_base_as_opt():
    from vitdeploy.export.engine_plan import plan_engine_build

    plan = plan_engine_build("m.onnx", "m.engine", chw=(3, 224, 224), image_sizes=(224, 336, 518))
    assert plan.profile_shapes() == ((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 518, 518))
