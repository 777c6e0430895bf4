"""``vitdeploy.Predictor.open``, what ``vitdeploy predict`` and a notebook open: an export folder with the pipeline
config's runtime section (a mapping or a pipeline.yaml path), predicting image paths, arrays and a preprocessed
batch alike, on the demo export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import vitdeploy
from vitdeploy.base.errors import ConfigError, InputError
from vitdeploy.demo import demo_images
from vitdeploy.runtime.auto_choice import cpu_candidates

pytestmark = pytest.mark.integration


def test_open_predicts_paths_arrays_and_a_preprocessed_batch_alike(demo_artifacts: Path):
    from PIL import Image

    images = demo_images()[:6]
    paths = [path for path, _ in images]
    with vitdeploy.Predictor.open(demo_artifacts, config={}) as predictor:
        assert predictor.backend_name in cpu_candidates()  # auto on a CPU: the fastest gated CPU backend here
        by_path = predictor.predict(paths, top_k=3)
        arrays = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
        by_array = predictor.predict(arrays, top_k=3)
        by_batch = predictor.predict(predictor.preprocess(paths), top_k=3)
        (single,) = predictor.predict(str(paths[0]))
    assert [p.label for p in by_path] == [p.label for p in by_array] == [p.label for p in by_batch]
    assert single.label == by_path[0].label and len(by_path[0].top_k) == 3
    assert sum(p.label == truth for p, (_, truth) in zip(by_path, images)) >= 5  # the demo model reads digits


def test_the_configs_runtime_section_chooses_the_backend_and_the_image_limit(demo_artifacts: Path, tmp_path: Path):
    image = demo_images()[0][0]
    config = tmp_path / "pipeline.yaml"
    config.write_text(json.dumps({"runtime": {"backend": "torch", "max_image_pixels": 1000}}))
    with vitdeploy.Predictor.open(demo_artifacts, config=config) as predictor:
        assert predictor.backend_name == "torch"
        with pytest.raises(InputError, match="pixels"):
            predictor.predict(image)  # 64x64 > 1000 pixels: refused before decoding
    with vitdeploy.Predictor.open(demo_artifacts, config={"runtime": {"backend": "torch"}}, backend="ort") as other:
        assert other.backend_name == "ort"  # the argument wins over the config, as -b over runtime.backend


def test_the_folder_defaults_to_the_configs_output_dir_and_faults_are_typed(demo_artifacts: Path, tmp_path: Path):
    with vitdeploy.Predictor.open(config={"export": {"output_dir": str(demo_artifacts)}}) as predictor:
        assert predictor.artifacts.directory == demo_artifacts.resolve()
    with pytest.raises(ConfigError, match="runtime.backend"):
        vitdeploy.Predictor.open(demo_artifacts, config={"runtime": {"backend": "tpu"}})
    with pytest.raises(InputError, match="224"):
        vitdeploy.Predictor.open(demo_artifacts, config={}, image_size=224)  # a fixed-size export: its one size
