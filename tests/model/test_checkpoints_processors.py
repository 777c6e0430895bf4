"""Which transformers image processor the preprocessing mirrors, and how far the other one is (issue 39, part 5).

transformers 5 has two processors per model: the PIL one (``ViTImageProcessorPil``), which vitdeploy mirrors,
and the torchvision one ("fast", ``ViTImageProcessor``), its default wherever torchvision is installed. Both run
in ``.venv-ref`` (transformers + torchvision; tests/helpers/library_reference.py, group ``processors``) on real
photos and on transparent images (RGBA with a gradient alpha, LA, a palette with a transparent index), each
opened as it is. Ours must equal the PIL processor wherever it runs; the fast one's distance is measured and
bounded by what the manifest's ``preprocess_reference`` says of each processor (``fast_max_levels``, measured:
1 level for ViT's and DINOv2's, 6 for DeiT's bicubic squash); where both refuse a
transparent image (ViT, DeiT: do_convert_rgb unset), ours is the library's own conversion (do_convert_rgb=True:
composited over white) and the record says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.library_fidelity import PIXEL_TOL, photo_files, photos, run_reference  # noqa: F401 (fixture)
from PIL import Image

from vitdeploy.model.formats.base import Source
from vitdeploy.model.formats.hf import HFReader
from vitdeploy.model.formats.hf.convert import hf_preprocess
from vitdeploy.model.formats.shared import read_json
from vitdeploy.model.provenance import TRANSPARENCY_CONVERTED, TRANSPARENCY_REFUSED
from vitdeploy.runtime.preprocess import Preprocessor

pytestmark = pytest.mark.integration

#: the model type each processor case belongs to (what the reader's record is built from)
MODEL_TYPES = {"vit-hw-224": "vit", "deit-256-crop-224": "deit", "bit-shortest-256-crop-224": "dinov2"}


@pytest.fixture(scope="module")
def images(photos, tmp_path_factory) -> Path:  # noqa: F811 - the fixture
    """The photos, and transparent images made from one of them (names sorted after the photos)."""
    out = tmp_path_factory.mktemp("images")
    for p in photo_files(photos):
        shutil.copy(p, out / p.name)
    rgb = np.asarray(Image.open(photos / "b_chelsea_451x300.jpg").convert("RGB"))
    h, w = rgb.shape[:2]
    alpha = (np.arange(w)[None, :].repeat(h, 0) * 255 // (w - 1)).astype(np.uint8)
    alpha[: h // 3] = 0  # a fully transparent band: what is under it must not show
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(out / "t1_rgba_gradient.png")
    Image.fromarray(np.dstack([rgb[..., 1], alpha]), "LA").save(out / "t2_la_gradient.png")
    palette = Image.fromarray(rgb).quantize(64)
    palette.save(out / "t3_palette_trns.png", transparency=3)
    return out


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("processors")
    return out, run_reference(images, out, "processors")


@pytest.mark.parametrize("case", list(MODEL_TYPES))
def test_ours_equals_the_pil_processor_and_the_fast_one_is_within_a_level(reference, images, case, capsys):
    out, cases = reference
    info = cases[case]
    assert info["default_backend"] == "torchvision"  # transformers' default beside torchvision: the fast one
    with np.load(out / case / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    pp = out / case / "preprocessor_config.json"
    spec = hf_preprocess(read_json(pp), 224, pp).spec
    record = HFReader().reference(
        Source("hf", out / case, meta={"model_type": MODEL_TYPES[case]}, meta_dir=out / case)
    )
    assert record["processor"].endswith("Pil") and record["fast_processor"] == record["processor"][: -len("Pil")]
    std = np.asarray(info["std"], dtype=np.float64).reshape(3, 1, 1)
    worst = {"photo": 0.0, "transparent": 0.0}
    for i, path in enumerate(photo_files(images)):
        kind = "transparent" if path.name.startswith("t") else "photo"
        ours = Preprocessor(spec)(path)
        if f"pil_{i}" in ref:
            diff = float(np.abs(ours - ref[f"pil_{i}"]).max())
            assert diff <= PIXEL_TOL, f"{case} {path.name}: ours vs the PIL processor {diff}"
            assert f"fast_{i}" in ref, info["errors"].get(f"fast_{i}")  # the two agree on what they refuse
            levels = float((np.abs(ref[f"fast_{i}"] - ref[f"pil_{i}"]) * std * 255).max())
            bound = record["fast_max_levels"] + 1e-3  # what the manifest says, measured here
            assert levels <= bound, f"{case} {path.name}: fast vs PIL {levels:.2f} levels, the record says {bound:.0f}"
            worst[kind] = max(worst[kind], levels)
        else:  # both processors refuse a transparent image; ours is transformers' own conversion to RGB
            assert kind == "transparent" and f"fast_{i}" not in ref, info["errors"]
            assert record["transparency"] == TRANSPARENCY_REFUSED
            diff = float(np.abs(ours - ref[f"pil_rgb_{i}"]).max())
            assert diff <= PIXEL_TOL, f"{case} {path.name}: ours vs do_convert_rgb=True {diff}"
    if record["transparency"] == TRANSPARENCY_CONVERTED:
        assert case.startswith("bit")  # DINOv2's processor converts: both backends ran on every image
    with capsys.disabled():
        print(
            f"\n{case}: fast vs PIL, max uint8 levels: photos {worst['photo']:.2f}, "
            f"transparent {worst['transparent']:.2f}"
        )
