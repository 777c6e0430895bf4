"""The ViT relatives people ship (issue 15) export and predict what their library predicts: register
tokens, no class token, average pooling with and without fc_norm, layer scale, qk-norm, position
tables without prefix rows (timm ``no_embed_class``), DeiT's distillation token, transformers' DINOv2
classifiers (class token + mean patch token, with and without registers), DINOv2 giant's SwiGLU MLP (timm
SwiGLUPacked, transformers use_swiglu_ffn).

Reference: timm in the reference environment (``tests/helpers/library_reference.py ... family``,
once per session: each model built by timm with random weights, saved as timm saves it, run eagerly
on timm's own preprocessing of the photos); transformers in-process (its model and image processor
read back from the folder save_pretrained wrote). Ours: ``vitdeploy export`` then ``Predictor`` on the
photo files with the ORT-optimised graph (``ort``) and the FP16 graph (``ort-fp16``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.library_fidelity import (
    LOGIT_TOL,
    PROB_TOL,
    assert_pixels,
    assert_same_predictions,
    export,
    photo_files,
    photos,  # noqa: F401 (the fixture)
    predict,
    run_reference,
)
from helpers.library_reference import randomize_
from PIL import Image

from vitdeploy.base.errors import CheckpointError
from vitdeploy.export.optimize import METADATA_KEY
from vitdeploy.model import load_checkpoint

pytestmark = pytest.mark.integration

FP16_LOGIT_TOL, FP16_PROB_TOL = 3e-2, 1e-2


@pytest.fixture(scope="session")
def family(photos, tmp_path_factory) -> tuple[Path, dict]:
    """Run the timm reference for the family cases once per session: (output folder, cases)."""
    out = tmp_path_factory.mktemp("family")
    return out, run_reference(photos, out, "family")


def _case(family, case: str) -> tuple[Path, dict[str, np.ndarray]]:
    out, cases = family
    with np.load(out / case / "reference.npz") as data:
        return out / case / cases[case]["checkpoint"], {k: data[k] for k in data.files}


def _ort_metadata(art: Path) -> dict:
    import onnx

    props = {p.key: p.value for p in onnx.load(str(art / "model.ort.onnx"), load_external_data=False).metadata_props}
    return json.loads(props[METADATA_KEY])


def _export_and_compare(ckpt: Path, ref: dict, photos: Path, out: Path, **sections) -> tuple[Path, dict]:
    art, manifest = export(ckpt, photos, out, **sections)
    for backend, logit_tol, prob_tol in (("ort", LOGIT_TOL, PROB_TOL), ("ort-fp16", FP16_LOGIT_TOL, FP16_PROB_TOL)):
        pixels, logits = predict(art, photos, backend)
        assert_pixels(pixels, ref["pixels"], f"{ckpt}: timm preprocessing")
        assert_same_predictions(logits, ref["logits"], logit_tol, prob_tol)
    return art, manifest


# --------------------------------------------------------------------------- class-token pooling


@pytest.mark.slow
def test_registers_layer_scale_and_no_prefix_positions(family, photos, tmp_path):
    """timm vit_tiny (2 blocks) with reg_tokens=4, no_embed_class=True, init_values=1e-5 (DINOv2-style),
    a bare state dict: everything read from the tensors, class-token pooling assumed and said."""
    ckpt, ref = _case(family, "timm_reg4_ls")
    art, manifest = _export_and_compare(ckpt, ref, photos, tmp_path / "art")
    vit = manifest["model"]["vit"]
    assert (vit["reg_tokens"], vit["pos_embed_prefix"], vit["layer_scale"], vit["pool"]) == (4, False, True, "token")
    assert any(
        "assumed class-token pooling" in n and "model.pool: avg" in n for n in manifest["model"]["source"]["notes"]
    )
    # class-token pooling with registers: the last block still computes the class token's row only, exactly
    meta = _ort_metadata(art)
    assert meta["last_block_class_token_only"] is True and meta["fused"].get("MultiHeadAttention") == 2


@pytest.mark.slow
def test_deit_distilled_averages_both_heads(family, photos, tmp_path):
    """timm deit_tiny_distilled (2 blocks), bare: the class and distillation heads averaged as timm does
    at inference; the distillation token says DeiT, so timm's deit pretrained_cfg (ImageNet mean/std)."""
    ckpt, ref = _case(family, "timm_deit_distilled")
    art, manifest = _export_and_compare(ckpt, ref, photos, tmp_path / "art")
    assert manifest["model"]["vit"]["distilled"] is True
    assert manifest["preprocess"]["mean"] == [0.485, 0.456, 0.406]
    assert any("deit_tiny_distilled_patch16_224" in n for n in manifest["model"]["source"]["notes"])
    assert _ort_metadata(art)["last_block_class_token_only"] is False  # the distillation token's row is read too


@pytest.mark.slow
def test_timm_swiglu_packed_dinov2_giant_family(family, photos, tmp_path):
    """timm vit_giant_patch14_reg4_dinov2 at tiny width (192, 3 heads, 2 blocks), bare: the SwiGLUPacked MLP
    read from fc1 writing twice what fc2 reads, so timm's DINOv2 architecture and its pretrained_cfg
    (ImageNet mean/std, crop_pct 1) assumed and said."""
    ckpt, ref = _case(family, "timm_swiglu_dinov2")
    art, manifest = _export_and_compare(ckpt, ref, photos, tmp_path / "art")
    vit = manifest["model"]["vit"]
    assert (vit["mlp"], vit["width"], vit["heads"], vit["mlp_ratio"] * vit["width"]) == ("swiglu", 192, 3, 512)
    assert (vit["reg_tokens"], vit["layer_scale"], vit["pos_embed_prefix"]) == (4, True, False)
    assert manifest["preprocess"]["mean"] == [0.485, 0.456, 0.406] and manifest["preprocess"]["crop_pct"] == 1.0
    assert any("vit_tiny_patch14_reg4_dinov2" in n for n in manifest["model"]["source"]["notes"])
    assert _ort_metadata(art)["last_block_class_token_only"] is True  # SwiGLU's Split is token-wise


# --------------------------------------------------------------------------- average pooling


@pytest.mark.slow
def test_no_class_token_avg_pool_fc_norm_qk_norm(family, photos, tmp_path):
    """timm vit_tiny (2 blocks), class_token=False, global_pool='avg' (fc_norm), qk_norm=True, bare."""
    ckpt, ref = _case(family, "timm_avg_fcnorm_qknorm")
    art, manifest = _export_and_compare(ckpt, ref, photos, tmp_path / "art")
    vit = manifest["model"]["vit"]
    assert (vit["class_token"], vit["pool"], vit["fc_norm"], vit["qk_norm"]) == (False, "avg", True, True)
    meta = _ort_metadata(art)
    # qk-norm sits between the projection and the attention: no fused attention, said in the log
    assert meta["last_block_class_token_only"] is False and meta["attention"] == "none"
    assert "MultiHeadAttention" not in meta["fused"]


@pytest.mark.slow
def test_hub_registers_avg_pool_layer_scale(family, photos, tmp_path):
    """timm save_for_hf folder: reg_tokens=2, global_pool='avg' (fc_norm), init_values=0.1."""
    ckpt, ref = _case(family, "timm_hub_reg_avg")
    art, manifest = _export_and_compare(ckpt, ref, photos, tmp_path / "art")
    vit = manifest["model"]["vit"]
    assert (vit["reg_tokens"], vit["pool"], vit["fc_norm"], vit["layer_scale"]) == (2, "avg", True, True)
    meta = _ort_metadata(art)  # attention fused with the extra prefix tokens and layer scale; no pruning
    assert meta["last_block_class_token_only"] is False and meta["fused"].get("MultiHeadAttention") == 2


@pytest.mark.slow
def test_avg_pool_without_fc_norm_from_config_or_model_pool(family, photos, tmp_path):
    """global_pool='avg', fc_norm=False: the hub folder's config.json says avg; the bare weights of the same
    model cannot, so they load as class-token pooling with a note, and model.pool: avg gives timm's output."""
    ckpt, ref = _case(family, "timm_hub_avg_no_fcnorm")
    _, manifest = _export_and_compare(ckpt, ref, photos, tmp_path / "hub")
    assert (manifest["model"]["vit"]["pool"], manifest["model"]["vit"]["fc_norm"]) == ("avg", False)

    bare = tmp_path / "bare.safetensors"  # away from config.json
    shutil.copyfile(ckpt / "model.safetensors", bare)
    guessed = load_checkpoint(bare)
    assert guessed.config.pool == "token"
    assert any("set model.pool: avg in pipeline.yaml" in n for n in guessed.notes)
    _, manifest = _export_and_compare(
        bare,
        ref,
        photos,
        tmp_path / "bare",
        model={"pool": "avg"},
        preprocess={"interpolation": "bicubic", "crop_pct": 0.9},
    )
    assert manifest["model"]["vit"]["pool"] == "avg"
    with pytest.raises(CheckpointError, match="config.json says global_pool 'avg' but model.pool is 'token'"):
        load_checkpoint(ckpt, pool="token")


# --------------------------------------------------------------------------- transformers DeiT (in-process)


@pytest.mark.slow
@pytest.mark.parametrize(
    "cls_name, distilled", [("DeiTForImageClassification", False), ("DeiTForImageClassificationWithTeacher", True)]
)
def test_transformers_deit_exports_and_matches(cls_name, distilled, photos, tmp_path):
    """Reference: transformers' DeiT (random weights, 2 layers, 224 px) and its DeiTImageProcessor (PIL).
    WithTeacher averages its class and distillation heads; the plain classifier reads the class token
    only and carries the distillation token as an unread prefix token (a register, to our ViT)."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    import torch

    transformers.logging.set_verbosity_error()
    config = transformers.DeiTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=192,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=10,
    )
    torch.manual_seed(20)
    model = randomize_(getattr(transformers, cls_name)(config), 20 + distilled)
    folder = tmp_path / "deit"
    model.save_pretrained(folder)
    transformers.DeiTImageProcessorPil().save_pretrained(folder)
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    pixels = np.stack(
        [
            processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
            for p in photo_files(photos)
        ]
    )
    with torch.no_grad():
        logits = model(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    art, manifest = _export_and_compare(folder, {"pixels": pixels, "logits": logits}, photos, tmp_path / "art")
    vit = manifest["model"]["vit"]
    assert (vit["distilled"], vit["reg_tokens"]) == ((True, 0) if distilled else (False, 1))
    assert _ort_metadata(art)["last_block_class_token_only"] is (not distilled)


# --------------------------------------------------------------------------- transformers DINOv2 (in-process)


def _hf_dinov2(folder: Path, registers: int, image_size: int, crop: int, seed: int, swiglu: bool = False):
    """A small transformers DINOv2 classifier (random weights, patch 14, 2 layers; ``swiglu``: giant's SwiGLU
    MLP) written by save_pretrained, with a BitImageProcessor as the hub's (shorter side, centre crop, bicubic,
    ImageNet mean/std): the model and transformers' own processor read back from the folder."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    import torch

    transformers.logging.set_verbosity_error()
    common = dict(
        image_size=image_size,
        patch_size=14,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_labels=10,
        layerscale_value=0.5,
        use_swiglu_ffn=swiglu,
    )
    if registers:
        model = transformers.Dinov2WithRegistersForImageClassification(
            transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **common)
        )
    else:
        model = transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**common))
    torch.manual_seed(seed)
    randomize_(model, seed).save_pretrained(folder)
    transformers.BitImageProcessorPil(
        size={"shortest_edge": crop + crop // 7},
        crop_size={"height": crop, "width": crop},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(folder)
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    assert processor.backend == "pil"
    return model, processor


def _hf_reference(model, processor, photos: Path) -> dict[str, np.ndarray]:
    import torch

    pixels = np.stack(
        [
            processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
            for p in photo_files(photos)
        ]
    )
    with torch.no_grad():
        return {"pixels": pixels, "logits": model(pixel_values=torch.from_numpy(pixels)).logits.numpy()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "registers, image_size, crop, swiglu",
    [(4, 42, 42, False), (4, 70, 42, False), (0, 70, 42, False), (0, 42, 42, True)],
    ids=["registers-native", "registers-crop-below-config", "plain-crop-below-config", "swiglu-giant-mlp"],
)
def test_transformers_dinov2_exports_and_matches(registers, image_size, crop, swiglu, photos, tmp_path):
    """Reference: transformers' Dinov2(WithRegisters)ForImageClassification and its BitImageProcessor (PIL).
    The head reads the class token and the mean patch token (registers left out) side by side. When the
    processor's crop is not config.json's image_size (as on the hub: 518 vs 224), transformers resamples the
    position table at every call (antialiased only with registers): the export is built at the crop.
    use_swiglu_ffn (DINOv2 giant's MLP): the packed weights_in is our fc1, at DINOv2's hidden width."""
    seed = 40 + registers + image_size + swiglu
    model, processor = _hf_dinov2(tmp_path / "dinov2", registers, image_size, crop, seed=seed, swiglu=swiglu)
    ref = _hf_reference(model, processor, photos)
    art, manifest = _export_and_compare(tmp_path / "dinov2", ref, photos, tmp_path / "art")
    vit = manifest["model"]["vit"]
    assert (vit["pool"], vit["reg_tokens"], vit["layer_scale"], vit["image_size"], vit["mlp"]) == (
        "token_avg",
        registers,
        True,
        crop,
        "swiglu" if swiglu else "gelu",
    )
    assert vit["pos_embed_prefix"] is (registers == 0)  # with registers the class position row is in cls_token
    assert (
        manifest["preprocess"]["interpolation"] == "bicubic"
        and manifest["preprocess"]["shortest_edge"] == crop + crop // 7
    )
    if image_size != crop:
        assert any(f"processor's {crop}x{crop} crop" in n for n in manifest["model"]["source"]["notes"])
    # the head reads every patch row: no class-token-only last block; attention fused with the registers
    meta = _ort_metadata(art)
    assert meta["last_block_class_token_only"] is False and meta["fused"].get("MultiHeadAttention") == 2
    gates = manifest["validation"]
    assert all(gates[g]["passed"] for g in ("validate-onnx", "validate-ort-optimized", "validate-fp16")), gates


@pytest.mark.parametrize("registers", [4, 0])
def test_transformers_dinov2_at_model_image_size_matches_transformers_at_that_size(registers, tmp_path):
    """model.image_size: the table resampled once from the checkpoint's own grid (config.json's 70 px), as
    transformers does for a 56 px input; the resize before the crop keeps its ratio to the processor's crop."""
    import torch

    model, _ = _hf_dinov2(tmp_path, registers, 70, 42, seed=9)
    loaded = load_checkpoint(tmp_path, image_size=56)
    assert (loaded.config.image_size, loaded.native_image_size) == (56, 70)
    assert (loaded.preprocess.height, loaded.preprocess.shortest_edge) == (56, 64)  # 48 * 56 / 42
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        assert float((loaded.model(x) - model(pixel_values=x).logits).abs().max()) <= 1e-5


def test_transformers_dinov2_model_without_head_gives_the_pooler_output(tmp_path):
    """Dinov2WithRegistersModel (no classifier): the features are transformers' pooler_output (the class token)."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    import torch

    transformers.logging.set_verbosity_error()
    config = transformers.Dinov2WithRegistersConfig(
        image_size=28, patch_size=14, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_register_tokens=2
    )
    model = randomize_(transformers.Dinov2WithRegistersModel(config), 7)
    model.save_pretrained(tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert (loaded.config.pool, loaded.config.num_classes, loaded.config.reg_tokens) == ("token", 0, 2)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert float((loaded.model(x) - model(pixel_values=x).pooler_output).abs().max()) <= 1e-5


def test_hf_dinov2_non_square_processor_crop_is_refused(tmp_path):
    """transformers would resample the table to a 2x3 grid for a 28x42 crop: a non-square ViT."""
    _hf_dinov2(tmp_path, 2, 42, 42, seed=1)
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "crop_size": {"height": 28, "width": 42}}))
    with pytest.raises(CheckpointError, match="28x42 crop .* non-square grid"):
        load_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path, image_size=42).config.image_size == 42  # model.image_size decides instead


def test_hf_model_types_outside_the_family_are_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "beit", "hidden_size": 32, "num_attention_heads": 2, "architectures": ["x"]})
    )
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import torch

    safetensors_torch.save_file({"embeddings.cls_token": torch.zeros(1, 1, 32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model_type 'beit' is not supported"):
        load_checkpoint(tmp_path)
