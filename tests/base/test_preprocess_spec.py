"""PreprocessSpec validation, and a manifest with a bad preprocess section at the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.base.preprocess_spec import INTERPOLATIONS, PreprocessSpec


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_every_documented_interpolation_is_accepted(interpolation):
    assert PreprocessSpec(interpolation=interpolation).interpolation == interpolation


@pytest.mark.parametrize("interpolation", ["cubic", "BICUBIC", "", None, 3])
def test_unknown_interpolation_is_refused_naming_the_choices(interpolation):
    with pytest.raises(ValueError) as info:
        PreprocessSpec(interpolation=interpolation)
    msg = str(info.value)
    assert "interpolation" in msg and repr(interpolation) in msg and "bicubic" in msg and "hamming" in msg


@pytest.mark.parametrize(
    "background", [(0, 0, 256), (-1, 0, 0), (0, 0), (0, 0, 0, 0), (0.5, 0, 0), ("255", 0, 0), (True, 0, 0), 255, None]
)
def test_background_must_be_three_ints_0_to_255(background):
    with pytest.raises(ValueError, match=r"background must be 3 integers in 0\.\.255"):
        PreprocessSpec(background=background)


def test_background_from_a_list_or_numpy_ints_is_a_plain_tuple():
    assert PreprocessSpec(background=[1, 2, 3]).background == (1, 2, 3)
    spec = PreprocessSpec(background=tuple(np.array([0, 128, 255], dtype=np.uint8)))
    assert spec.background == (0, 128, 255) and all(type(v) is int for v in spec.background)
    assert hash(PreprocessSpec(background=[1, 2, 3])) == hash(PreprocessSpec(background=(1, 2, 3)))


def test_from_dict_validates_and_round_trips():
    spec = PreprocessSpec(style="timm", interpolation="lanczos", background=(0, 10, 20))
    assert PreprocessSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="interpolation"):
        PreprocessSpec.from_dict({**spec.to_dict(), "interpolation": "cubic"})
    with pytest.raises(ValueError, match="background"):
        PreprocessSpec.from_dict({**spec.to_dict(), "background": [0, 300, 0]})
    with pytest.raises(ValueError, match="background"):
        PreprocessSpec.from_dict({**spec.to_dict(), "background": [0, 1.5, 0]})  # no silent rounding


def test_predict_on_a_manifest_with_a_bad_interpolation_exits_2_with_one_line(tmp_path: Path):
    from PIL import Image

    from vitdeploy.cli import main

    out = tmp_path / "out"
    out.mkdir()
    manifest = {
        "format": "vitdeploy-manifest",
        "version": 1,
        "name": "bad",
        "preprocess": {"style": "hf", "height": 32, "width": 32, "interpolation": "cubic"},
        "io": {
            "input": {"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, 32, 32]},
            "output": {"name": "logits", "dtype": "float32", "shape": ["batch", 2]},
        },
        "batch": {"min": 1, "opt": 1, "max": 1},
        "labels": ["a", "b"],
        "artifacts": {},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    image = tmp_path / "img.png"
    Image.new("RGB", (32, 32), (10, 20, 30)).save(image)
    result = CliRunner().invoke(main, ["predict", str(image), "-a", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "preprocess" in lines[0] and "'cubic'" in lines[0] and "interpolation" in lines[0]
    assert result.stdout == ""
