"""The text side of a zero-shot classifier (vitdeploy/model/zero_shot.py) against transformers itself: the class
embeddings, logit scale and bias it reads from a random-weight CLIPModel / SiglipModel (tiny, the real structure,
tokenizers made here: tests/helpers/tiny_contrastive.py) give, on the image tower's own embeddings of the demo
photos, the probabilities of transformers' zero-shot-image-classification pipeline with the same prompt; several
templates are ensembled as CLIP does; checkpoints without a text tower are refused in one line naming them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitdeploy.base.errors import CheckpointError, MissingDependencyError
from vitdeploy.demo import DEMO_DIR, IMAGES_DIR
from vitdeploy.model.vit import VisionTransformer, ViTConfig
from vitdeploy.model.zero_shot import bake, text_classes
from vitdeploy.runtime.postprocess import probabilities

transformers = pytest.importorskip("transformers")

LABELS = ("zero", "one", "two", "three", "four")
TEMPLATE = "a photo of a {}."
PHOTOS = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))[:6]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def towers(tmp_path_factory) -> dict[str, Path]:
    from helpers.tiny_contrastive import save_tiny_clip, save_tiny_siglip

    root = tmp_path_factory.mktemp("contrastive")
    return {"clip": save_tiny_clip(root / "clip"), "siglip": save_tiny_siglip(root / "siglip")}


def _pipeline_scores(folder: Path, template: str) -> np.ndarray:
    """(photos, classes) scores of transformers' zero-shot pipeline, in LABELS' order."""
    from PIL import Image

    pipe = transformers.pipeline("zero-shot-image-classification", model=str(folder))
    out = []
    for photo in PHOTOS:
        answer = pipe(Image.open(photo).convert("RGB"), candidate_labels=list(LABELS), hypothesis_template=template)
        by_label = {a["label"]: a["score"] for a in answer}
        out.append([by_label[name] for name in LABELS])
    return np.asarray(out)


def _image_embeddings(folder: Path) -> torch.Tensor:
    """The image tower's get_image_features on the checkpoint processor's pixels of each photo."""
    from PIL import Image

    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(str(folder))
    pixels = processor([Image.open(p).convert("RGB") for p in PHOTOS], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        out = model.get_image_features(pixel_values=pixels)
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@pytest.mark.parametrize("family, scores", [("clip", "softmax"), ("siglip", "sigmoid")])
def test_class_embeddings_give_the_pipelines_scores(towers, family, scores):
    """scale x normalize(image) @ classes.T (+ bias), scored by the library's function: the pipeline's numbers."""
    classes = text_classes(towers[family], LABELS, (TEMPLATE,))
    assert classes.scores == scores and classes.labels == LABELS
    assert (classes.logit_bias is not None) == (family == "siglip")
    assert torch.allclose(classes.embeddings.norm(dim=-1), torch.ones(len(LABELS)), atol=1e-6)
    image = torch.nn.functional.normalize(_image_embeddings(towers[family]), dim=-1)
    logits = classes.logit_scale * image @ classes.embeddings.T + (classes.logit_bias or 0.0)
    ours = probabilities(logits.numpy(), scores)
    reference = _pipeline_scores(towers[family], TEMPLATE)
    assert (ours.argmax(axis=1) == reference.argmax(axis=1)).all()
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    top2 = np.sort(reference, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > 1e-3).all(), "sharpened: a clear top-1, not a tie"


def test_templates_are_ensembled_as_clip_does(towers):
    """Each prompt's embedding normalised, the class's averaged, the mean normalised (CLIP's notebook)."""
    templates = ("a photo of a {}.", "itap of a {}.", "art of the {}.")
    classes = text_classes(towers["clip"], LABELS, templates)
    model = transformers.CLIPModel.from_pretrained(str(towers["clip"])).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(towers["clip"]))
    with torch.inference_mode():
        expected = []
        for name in LABELS:
            out = model.get_text_features(
                **tokenizer([t.format(name) for t in templates], padding=True, return_tensors="pt")
            )
            out = out if isinstance(out, torch.Tensor) else out.pooler_output
            mean = torch.nn.functional.normalize(out, dim=-1).mean(dim=0)
            expected.append(mean / mean.norm())
    torch.testing.assert_close(classes.embeddings, torch.stack(expected), atol=1e-6, rtol=0)
    single = text_classes(towers["clip"], LABELS, templates[:1]).embeddings
    assert not torch.allclose(classes.embeddings, single, atol=1e-3), "the templates changed the classes"


def test_record_names_what_was_baked(towers):
    classes = text_classes(towers["siglip"], LABELS, (TEMPLATE,))
    record = classes.record("some/siglip")
    assert record["labels"] == list(LABELS) and record["templates"] == [TEMPLATE]
    assert record["scores"] == "sigmoid" and record["logit_bias"] == pytest.approx(-2.0)
    assert record["logit_scale"] == pytest.approx(60.0, rel=1e-5)
    assert record["text_model"]["class"] == "SiglipModel"
    assert record["text_model"]["tokenizer_args"] == {"padding": "max_length", "max_length": 64, "truncation": True}
    assert record["text_model"]["checkpoint"] == "some/siglip"
    json.dumps(record)  # the manifest's


def test_bake_makes_the_tower_a_classifier_of_the_classes(towers):
    """The baked head on a tower of the embedding's width: the logits are scale x cosine (+ bias)."""
    classes = text_classes(towers["siglip"], LABELS, (TEMPLATE,))
    tower = VisionTransformer(ViTConfig(image_size=32, patch_size=8, width=64, depth=1, heads=4, num_classes=0)).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        embedding = tower.forward_features(x)
        baked = bake(tower, classes, Path("tower"))
        logits = baked(x)
    assert baked.cfg.num_classes == len(LABELS) and baked.cfg.head_l2norm
    expected = classes.logit_scale * torch.nn.functional.normalize(embedding, dim=-1) @ classes.embeddings.T - 2.0
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-5)


def test_bake_refuses_a_tower_with_a_head_or_another_width(towers):
    classes = text_classes(towers["clip"], LABELS, (TEMPLATE,))
    with pytest.raises(CheckpointError, match="already has a 10-class head"):
        bake(
            VisionTransformer(ViTConfig(image_size=32, patch_size=8, width=64, depth=1, heads=4, num_classes=10)),
            classes,
            Path("x"),
        )
    with pytest.raises(CheckpointError, match="embeds into 32 dimensions but the image tower returns 64"):
        bake(
            VisionTransformer(ViTConfig(image_size=32, patch_size=8, width=64, depth=1, heads=4, num_classes=0)),
            classes,
            Path("x"),
        )


def test_a_checkpoint_without_a_text_tower_is_refused_naming_it(tmp_path):
    with pytest.raises(CheckpointError, match=f"{DEMO_DIR}: a zero-shot classifier needs the checkpoint's text tower"):
        text_classes(DEMO_DIR, LABELS, (TEMPLATE,))
    vision = transformers.CLIPVisionModelWithProjection(
        transformers.CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        )
    )
    vision.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="found model_type 'clip_vision_model'"):
        text_classes(tmp_path, LABELS, (TEMPLATE,))


def test_a_checkpoint_without_its_tokenizer_is_refused(towers, tmp_path):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).symlink_to(towers["clip"] / name)
    with pytest.raises(CheckpointError, match="no tokenizer beside the checkpoint"):
        text_classes(tmp_path, LABELS, (TEMPLATE,))


def test_an_openclip_checkpoint_needs_open_clip(tmp_path, monkeypatch):
    """Its text tower runs in open_clip: without the package, one line naming what to install."""
    monkeypatch.setitem(sys.modules, "open_clip", None)  # not importable, whether installed or not
    (tmp_path / "open_clip_config.json").write_text("{}")
    with pytest.raises(MissingDependencyError, match="an OpenCLIP checkpoint's text tower .*open-clip-torch"):
        text_classes(tmp_path, LABELS, (TEMPLATE,))


@pytest.mark.integration
def test_an_openclip_checkpoints_classes_are_open_clips_own(tmp_path):
    """In the reference environment (open_clip installed): the classes of a tiny OpenCLIP model (open_clip's
    create_model('local-dir:'), get_tokenizer, encode_text) are open_clip's build_zero_shot_classifier's."""
    from helpers.library_fidelity import REPO, reference_python

    python = reference_python()
    if not python.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"reference environment missing ({python}); CI must build it")
        pytest.skip(f"reference environment missing ({python}): run `make reference-env`")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    script = REPO / "tests" / "helpers" / "open_clip_zero_shot.py"
    command = [str(python), str(script), str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["max_diff"] < 1e-6 and got["shape"] == [3, 24]
    assert got["logit_scale"] == pytest.approx(got["library_scale"]) and got["scores"] == "softmax"
    assert got["text_model"]["library"] == "open_clip" and got["text_model"]["method"] == "encode_text"
