"""Headless backbones agree with their own library's features on real photos (issue 37).

transformers runs in-process (its PIL image processors, its models' ``pooler_output``); timm runs in the
reference environment (``tests/helpers/library_reference.py ... embedding``: ``num_classes=0``, what
``model(x)`` returns there). Each checkpoint is written by its library with random weights, exported by
vitdeploy with the defaults (``model.output: auto`` makes it an embedding model) and predicted through the
runtime: the vectors must be the library's, on every ONNX graph of FP32 and on the eager backend.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers.library_fidelity import assert_pixels, export, photo_files, photos, run_reference  # noqa: F401
from PIL import Image

from vitdeploy.runtime.predictor import Predictor

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VECTOR_TOL = 1e-4  # the same bound as the classifiers' logits (helpers/library_fidelity.LOGIT_TOL)


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        level = logging.getLogger("transformers").level
        logging.getLogger("transformers").setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.getLogger("transformers").setLevel(level)


def _randomize(model, seed: int):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lambda1") or name.endswith("lambda2"):  # DINOv2's layer scale: keep it near 1
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
            elif p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval()


def _vit_model(folder: Path):
    cfg = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, image_size=32, patch_size=8
    )
    model = _randomize(transformers.ViTModel(cfg), 1)  # with its pooler (dense + tanh): pooler_output
    processor = transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    return model, processor


def _dinov2(folder: Path, registers: int, swiglu: bool = False):
    kwargs = dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=42, patch_size=14, use_swiglu_ffn=swiglu
    )
    if registers:
        cfg, cls = transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **kwargs), "WithRegisters"
    else:
        cfg, cls = transformers.Dinov2Config(**kwargs), ""
    model = _randomize(getattr(transformers, f"Dinov2{cls}Model")(cfg), 2 + registers)
    processor = transformers.BitImageProcessor(
        size={"shortest_edge": 48},
        crop_size={"height": 42, "width": 42},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    return model, processor


BACKBONES = {
    "vit-pooler": _vit_model,
    "dinov2": lambda folder: _dinov2(folder, 0),
    "dinov2-registers": lambda folder: _dinov2(folder, 4),
    "dinov2-swiglu": lambda folder: _dinov2(folder, 4, swiglu=True),  # DINOv2 giant's MLP, small
}


def _theirs(model, processor, photos: Path) -> tuple[np.ndarray, np.ndarray]:
    pixels = np.stack(
        [
            processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
            for p in photo_files(photos)
        ]
    )
    with torch.no_grad():
        return pixels, model(pixel_values=torch.from_numpy(pixels)).pooler_output.numpy()


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_transformers_backbone_exports_its_pooler_output(backbone, photos, tmp_path):  # noqa: F811
    """ViTModel (pooler_output: tanh(dense(class token))), Dinov2Model and Dinov2WithRegistersModel (the
    normalised class token; with registers also with DINOv2 giant's SwiGLU MLP): exported with the defaults, the
    runtime gives transformers' pooler_output."""
    with _quiet():
        model, processor = BACKBONES[backbone](tmp_path / "ckpt")
        model.save_pretrained(tmp_path / "ckpt")
        processor.save_pretrained(tmp_path / "ckpt")
        pixels_ref, vectors_ref = _theirs(model, processor, photos)
    fp32_only = {
        "fp16": {"enabled": False},
        "int8": {"enabled": False},
        "batch": {"min": 1, "opt": 2, "max": 4},
    }  # the library's vectors: FP32 graphs
    art, manifest = export(tmp_path / "ckpt", photos, tmp_path / "art", export=fp32_only)
    assert manifest["output"] == {"kind": "embedding", "normalize": False} and manifest["labels"] == []
    assert manifest["io"]["output"] == {"name": "EMBEDDINGS", "dtype": "float32", "shape": ["batch", 64]}
    assert manifest["model"]["vit"]["pooler"] is (backbone == "vit-pooler")
    assert manifest["model"]["vit"]["mlp"] == ("swiglu" if backbone == "dinov2-swiglu" else "gelu")
    for backend in ("torch", "ort"):
        with Predictor.from_artifacts(art, backend=backend) as predictor:
            pixels = predictor.preprocess(photo_files(photos))
            assert_pixels(pixels, pixels_ref, f"{backbone}: transformers' preprocessing")
            vectors = predictor.embed(pixels)
        assert float(np.abs(vectors - vectors_ref).max()) <= VECTOR_TOL, backend
    fp32 = manifest["validation"]["validate-onnx"]
    assert fp32["metrics"]["recall_at_k"] == 1.0 and fp32["metrics"]["cosine"] >= 0.99999
    assert "flips" not in fp32 and "top1_agreement" not in fp32["metrics"]


def test_a_classifier_exported_as_embedding_gives_the_features_its_head_reads(photos, tmp_path):  # noqa: F811
    """model.output: embedding on ViTForImageClassification: the class token after the last LayerNorm (what
    its classifier reads: ``model.vit(x).last_hidden_state[:, 0]``), no labels, L2-normalised on request."""
    cfg = transformers.ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=3,
        id2label={0: "a", 1: "b", 2: "c"},
        label2id={"a": 0, "b": 1, "c": 2},
    )
    with _quiet():
        model = _randomize(transformers.ViTForImageClassification(cfg), 7)
        processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32})
        model.save_pretrained(tmp_path / "ckpt")
        processor.save_pretrained(tmp_path / "ckpt")
        pixels = np.stack(
            [
                processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
                for p in photo_files(photos)
            ]
        )
        with torch.no_grad():
            features = model.vit(pixel_values=torch.from_numpy(pixels)).last_hidden_state[:, 0].numpy()
    sections = {"model": {"output": "embedding", "normalize": True}, "export": {"fp16": {"enabled": False}}}
    art, manifest = export(tmp_path / "ckpt", photos, tmp_path / "art", **sections)
    assert manifest["output"] == {"kind": "embedding", "normalize": True} and manifest["labels"] == []
    with Predictor.from_artifacts(art, backend="ort") as predictor:
        vectors = predictor.embed(photo_files(photos))
    expected = features / np.linalg.norm(features, axis=1, keepdims=True)
    assert float(np.abs(vectors - expected).max()) <= VECTOR_TOL
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_dinov2_registers_patch_tokens_are_last_hidden_states_patches(photos, tmp_path):  # noqa: F811
    """Dinov2WithRegistersModel exported with ``model.patch_tokens``: PATCH_TOKENS (torch and ort, every FP32
    graph) are transformers' ``last_hidden_state[:, 1 + num_register_tokens:]`` (no class token, no registers,
    not normalised), EMBEDDINGS still its pooler_output; the validation judged both."""
    with _quiet():
        model, processor = _dinov2(tmp_path / "ckpt", 4)
        model.save_pretrained(tmp_path / "ckpt")
        processor.save_pretrained(tmp_path / "ckpt")
        pixels_ref, vectors_ref = _theirs(model, processor, photos)
        with torch.no_grad():
            hidden = model(pixel_values=torch.from_numpy(pixels_ref)).last_hidden_state.numpy()
    patches_ref = hidden[:, 1 + 4 :]
    fp32_only = {"fp16": {"enabled": False}, "int8": {"enabled": False}, "batch": {"min": 1, "opt": 2, "max": 4}}
    art, manifest = export(tmp_path / "ckpt", photos, tmp_path / "art", export=fp32_only, model={"patch_tokens": True})
    assert manifest["io"]["patch_tokens"] == {"name": "PATCH_TOKENS", "dtype": "float32", "shape": ["batch", 9, 64]}
    for backend in ("torch", "ort"):
        with Predictor.from_artifacts(art, backend=backend) as predictor:
            vectors, patches = predictor.embed(predictor.preprocess(photo_files(photos)), patch_tokens=True)
        assert float(np.abs(vectors - vectors_ref).max()) <= VECTOR_TOL, backend
        assert patches.shape == patches_ref.shape, backend
        assert float(np.abs(patches - patches_ref).max()) <= VECTOR_TOL, backend
    for stage in ("validate-onnx", "validate-ort-optimized"):
        metrics = manifest["validation"][stage]["metrics"]
        assert metrics["patch_cosine"] >= 0.99999 and metrics["patch_cosine_p01"] >= metrics["patch_cosine"], stage


@pytest.fixture(scope="module")
def timm_embedding(photos, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("timm-embedding")
    return out, run_reference(photos, out, "embedding")


@pytest.mark.parametrize("case", ["timm_headless_token", "timm_headless_reg_avg", "timm_headless_swiglu"])
def test_timm_num_classes_0_exports_what_timm_returns(timm_embedding, case, photos, tmp_path):  # noqa: F811
    """timm with num_classes=0 (class-token pooling; registers with average pooling and fc_norm; DINOv2 giant's
    SwiGLU family): the runtime's vectors are what ``model(x)`` returns in timm, its preprocessing timm's; exported
    with ``model.patch_tokens``, its PATCH_TOKENS are ``forward_features(x)[:, num_prefix_tokens:]``."""
    out, cases = timm_embedding
    with np.load(out / case / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    fp32_only = {"fp16": {"enabled": False}, "int8": {"enabled": False}, "batch": {"min": 1, "opt": 2, "max": 4}}
    ckpt = out / case / cases[case]["checkpoint"]
    art, manifest = export(ckpt, photos, tmp_path / "art", export=fp32_only, model={"patch_tokens": True})
    assert manifest["output"] == {"kind": "embedding", "normalize": False, "patch_tokens": True}
    with Predictor.from_artifacts(art, backend="ort") as predictor:
        pixels = predictor.preprocess(photo_files(photos))
        assert_pixels(pixels, ref["pixels"], f"{case}: timm preprocessing")
        vectors, patches = predictor.embed(pixels, patch_tokens=True)
    assert vectors.shape == ref["logits"].shape and patches.shape == ref["patch_tokens"].shape
    assert float(np.abs(vectors - ref["logits"]).max()) <= VECTOR_TOL
    assert float(np.abs(patches - ref["patch_tokens"]).max()) <= VECTOR_TOL
