"""The peers read through the Hub path agree with their library exactly as from a folder (issue 39).

A timm hub folder written by timm (``save_for_hf``; the reference run in ``.venv-ref``, group ``hub``) and a
transformers DINOv2-with-registers classifier written by ``save_pretrained`` are served by the loopback Hub
(tests/helpers/fake_hub.py) as ``timm/<model>.<tag>`` and ``org/name``; vitdeploy loads them by name
(``hf-hub:`` for timm, as timm spells it) and must give the library's own pixels and logits, and the very
tensors and preprocessing it reads from the folder.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.fake_hub import FakeHub, folder_files, point_at
from helpers.library_fidelity import assert_pixels, assert_same_predictions, photo_files, photos, run_reference  # noqa: F401
from helpers.library_reference import randomize_
from PIL import Image

from vitdeploy.model import load_checkpoint
from vitdeploy.runtime.preprocess import Preprocessor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hub():
    server = FakeHub()
    yield server
    server.close()


def eager(loaded, pixels: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return loaded.model(torch.from_numpy(pixels)).numpy()


def same_as_folder(from_hub, from_folder) -> None:
    import torch

    assert from_hub.config == from_folder.config and from_hub.preprocess == from_folder.preprocess
    assert from_hub.preprocess_origins == from_folder.preprocess_origins and from_hub.labels == from_folder.labels
    ours, theirs = from_hub.model.state_dict(), from_folder.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_timm_hub_repo_by_name_predicts_what_timm_predicts(hub, photos, tmp_path, monkeypatch):
    """Reference: timm (save_for_hf, then create_model("local-dir:..."), resolve_data_config + create_transform)."""
    cases = run_reference(photos, tmp_path / "ref", "hub")
    folder = tmp_path / "ref" / "timm_hub_for_hub"
    with np.load(folder / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    commit = hub.add("timm/vit_tiny_patch16_224.for_hub_test").commit(
        {k: v for k, v in folder_files(folder).items() if k != "reference.npz"}
    )
    point_at(hub, monkeypatch, tmp_path / "hf")
    loaded = load_checkpoint("hf-hub:timm/vit_tiny_patch16_224.for_hub_test")
    assert loaded.hub.commit == commit and loaded.source_format == "timm"
    assert loaded.preprocess_reference["library"] == "timm" and cases["timm_hub_for_hub"]["checkpoint"] == "."
    same_as_folder(loaded, load_checkpoint(folder))
    pixels = Preprocessor(loaded.preprocess).batch(photo_files(photos))
    assert_pixels(pixels, ref["pixels"], "timm hub preprocessing through the Hub")
    assert_same_predictions(eager(loaded, pixels), ref["logits"])


def test_a_transformers_dinov2_repo_by_name_predicts_what_transformers_predicts(hub, photos, tmp_path, monkeypatch):
    """Reference: transformers in-process (Dinov2WithRegistersForImageClassification, its PIL image processor)."""
    import torch

    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.Dinov2WithRegistersConfig(
        image_size=56,
        patch_size=14,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        mlp_ratio=2,
        num_register_tokens=2,
        num_labels=5,
    )
    model = randomize_(transformers.Dinov2WithRegistersForImageClassification(config), 7)
    folder = tmp_path / "dinov2"
    model.save_pretrained(folder)
    size = {"shortest_edge": 64}
    transformers.BitImageProcessorPil(size=size, crop_size={"height": 56, "width": 56}).save_pretrained(folder)
    hub.add("acme/dinov2-reg-tiny").commit(folder_files(folder), tag="v2")
    point_at(hub, monkeypatch, tmp_path / "hf")
    loaded = load_checkpoint("acme/dinov2-reg-tiny@v2")
    assert loaded.preprocess_reference["processor"] == "BitImageProcessorPil"
    same_as_folder(loaded, load_checkpoint(folder))
    processor = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
    ref_pixels = np.stack(
        [
            processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
            for p in photo_files(photos)
        ]
    )
    with torch.no_grad():
        ref_logits = model(pixel_values=torch.from_numpy(ref_pixels)).logits.numpy()
    pixels = Preprocessor(loaded.preprocess).batch(photo_files(photos))
    assert_pixels(pixels, ref_pixels, "DINOv2 processor through the Hub")
    assert_same_predictions(eager(loaded, pixels), ref_logits)
