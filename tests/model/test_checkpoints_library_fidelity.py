"""Every checkpoint predicts what its own library predicts (issue 9): pixels and probabilities on real
photos, against each library running its own preprocessing and its own eager model.

References, by library:

* timm and torchvision run in the reference environment ``.venv-ref`` (they cannot be imported beside
  vitdeploy's CPU torch): ``tests/helpers/library_reference.py`` builds the models there, saves
  the checkpoints as the library does (bare state dicts, timm ``save_for_hf`` hub folders), and runs
  timm's ``resolve_data_config`` + ``create_transform`` and torchvision's ``Weights.transforms()``
  and each eager forward. It runs once per test session. Without ``.venv-ref`` these tests skip
  (one line) except in CI (``CI=true``), where its absence fails. ``VITDEPLOY_REF_PYTHON`` points at
  another interpreter.
* transformers runs in-process: its own image processors (``AutoImageProcessor`` on the saved
  ``preprocessor_config.json``, the PIL backend) and ``ViTForImageClassification``.

Ours: ``vitdeploy export`` of the checkpoint as a user would write it, then ``Predictor`` (the
``ort`` backend runs the ORT-optimised graph; ``ort-fp16`` the FP16 graph) on the photo files.
Photos: scikit-image's bundled real photographs, saved as JPEG/PNG at several aspect ratios.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
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
from helpers.library_reference import randomize_  # the same random weights helper on both sides
from PIL import Image

from vitdeploy.base.config import parse_config
from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.cli import main as cli_main
from vitdeploy.model import load_checkpoint
from vitdeploy.runtime.preprocess import Preprocessor, resize_plan

pytestmark = pytest.mark.integration

# --------------------------------------------------------------------------- the reference run


@pytest.fixture(scope="session")
def reference(photos, tmp_path_factory) -> tuple[Path, dict]:
    """Run the timm / torchvision reference once per session: (output folder, cases.json)."""
    out = tmp_path_factory.mktemp("reference")
    return out, run_reference(photos, out)


def ref_arrays(reference, case: str) -> dict[str, np.ndarray]:
    out, _ = reference
    with np.load(out / case / "reference.npz") as data:
        return {k: data[k] for k in data.files}


def checkpoint_of(reference, case: str) -> Path:
    out, cases = reference
    return out / case / cases[case]["checkpoint"]


# --------------------------------------------------------------------------- ours


def eager_logits(loaded, pixels: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return loaded.model(torch.from_numpy(pixels)).numpy()


# --------------------------------------------------------------------------- 1. bare timm state dict


@pytest.mark.slow
def test_bare_timm_state_dict_gets_timms_default_and_says_so(reference, photos, tmp_path):
    """Reference: timm (vit_tiny_patch16_224 built by timm, resolve_data_config + create_transform)."""
    ref = ref_arrays(reference, "timm_bare")
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"checkpoint": str(checkpoint_of(reference, "timm_bare"))},
                "validation": {"images": str(photos), "noise_samples": 2},
                "export": {"output_dir": str(tmp_path / "art"), "batch": {"min": 1, "opt": 2, "max": 4}},
            }
        )
    )
    result = CliRunner().invoke(cli_main, ["export", "-c", str(config), "--engine", "skip"])
    assert result.exit_code == 0, result.output
    printed = result.stderr
    # the model understood and the assumption, at default verbosity, with how to override it
    assert "model: timm ViT from" in printed and "width 192, depth 2, 3 heads" in printed
    assert "assumed timm's default for vit_tiny_patch16_224" in printed and "preprocess: (" in printed
    assert "crop_pct" in printed and "library default: timm pretrained_cfg of vit_tiny_patch16_224" in printed
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["preprocess"]["crop_pct"] == 0.9 and manifest["preprocess"]["interpolation"] == "bicubic"
    assert set(manifest["preprocess_origins"].values()) == {
        "library default: timm pretrained_cfg of vit_tiny_patch16_224"
    }
    assert any("assumed" in n for n in manifest["model"]["source"]["notes"])

    pixels, logits = predict(tmp_path / "art", photos)
    assert_pixels(pixels, ref["pixels"], "timm default preprocessing")
    assert_same_predictions(logits, ref["logits"])
    # the test can tell: the old guess (224 stretch, bilinear, mean/std 0.5) gives other pixels
    stretched = Preprocessor(PreprocessSpec(style="hf", interpolation="bilinear")).batch(photo_files(photos))
    assert float(np.abs(stretched - ref["pixels"]).max()) > 0.5


def test_bare_deit_state_dict_with_variant_gets_deit_mean_std(reference, photos):
    """Reference: timm deit_tiny_patch16_224 (ImageNet mean/std); model.variant names the family."""
    ref = ref_arrays(reference, "timm_deit")
    loaded = load_checkpoint(checkpoint_of(reference, "timm_deit"), variant="deit_tiny_patch16_224")
    assert loaded.preprocess.mean == (0.485, 0.456, 0.406)
    pixels = Preprocessor(loaded.preprocess).batch(photo_files(photos))
    assert_pixels(pixels, ref["pixels"], "timm deit default preprocessing")
    assert_same_predictions(eager_logits(loaded, pixels), ref["logits"])


# --------------------------------------------------------------------------- 4. head count


@pytest.mark.slow
def test_head_count_of_a_bare_state_dict_is_said_and_settable(reference, photos, tmp_path):
    """Reference: timm vit_tiny_patch16_224 built with num_heads=6 (the standard tiny has 3)."""
    ref = ref_arrays(reference, "timm_heads6")
    ckpt = checkpoint_of(reference, "timm_heads6")
    guessed = load_checkpoint(ckpt)
    assert guessed.config.heads == 3
    assert any("assumed 3 attention heads" in n and "model.num_heads" in n for n in guessed.notes)
    # the guess changes the answers: the test can tell
    assert float(np.abs(eager_logits(guessed, ref["pixels"]) - ref["logits"]).max()) > 0.05

    art, manifest = export(ckpt, photos, tmp_path / "art", model={"num_heads": 6})
    assert manifest["model"]["vit"]["heads"] == 6
    assert manifest["model"]["source"]["heads_origin"] == "pipeline.yaml: model.num_heads"
    pixels, logits = predict(art, photos)  # ORT-optimised graph: attention fused with 6 heads
    assert_pixels(pixels, ref["pixels"], "timm default preprocessing")
    assert_same_predictions(logits, ref["logits"])


def test_width_without_a_named_variant_points_at_a_key_that_exists(tmp_path):
    import safetensors.torch
    import torch

    sd = {
        "patch_embed.proj.weight": torch.zeros(200, 3, 16, 16),
        "patch_embed.proj.bias": torch.zeros(200),
        "cls_token": torch.zeros(1, 1, 200),
        "pos_embed": torch.zeros(1, 5, 200),
        "blocks.0.mlp.fc1.weight": torch.zeros(800, 200),
    }
    safetensors.torch.save_file(sd, str(tmp_path / "w200.safetensors"))
    from vitdeploy.base.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"set model\.num_heads in pipeline\.yaml") as info:
        load_checkpoint(tmp_path / "w200.safetensors")
    assert "variant=" not in str(info.value)
    assert parse_config({"model": {"num_heads": 8}}, None).model.num_heads == 8  # the key exists


# --------------------------------------------------------------------------- 5. tanh GELU (timm)


@pytest.mark.slow
def test_timm_gelu_tanh_hub_folder_exports_and_matches(reference, photos, tmp_path):
    """Reference: timm, model saved by timm.save_for_hf with act_layer gelu_tanh and read back by timm."""
    ref = ref_arrays(reference, "timm_hub_gelu_tanh")
    ckpt = checkpoint_of(reference, "timm_hub_gelu_tanh")
    assert json.loads((ckpt / "config.json").read_text())["model_args"]["act_layer"] == "gelu_tanh"
    art, manifest = export(ckpt, photos, tmp_path / "art")
    assert manifest["model"]["vit"]["act"] == "gelu_tanh"
    fused = manifest["export"]["ort_optimize"]["fused"]
    # ORT's optimiser fuses the tanh form into FastGelu (the tanh approximation), never into BiasGelu (erf)
    assert fused.get("FastGelu") == 2 and "BiasGelu" not in fused
    for backend, logit_tol, prob_tol in (("ort", LOGIT_TOL, PROB_TOL), ("ort-fp16", 3e-2, 1e-2)):
        pixels, logits = predict(art, photos, backend)
        assert_pixels(pixels, ref["pixels"], "timm hub preprocessing")
        assert_same_predictions(logits, ref["logits"], logit_tol, prob_tol)


# --------------------------------------------------------------------------- 6. timm crop modes


@pytest.mark.parametrize("case", ["timm_hub_squash", "timm_hub_border"])
def test_timm_crop_modes_match_timm(reference, photos, case):
    """Reference: timm's create_transform for crop_mode squash / border (saved in pretrained_cfg by save_for_hf)."""
    ref = ref_arrays(reference, case)
    _, cases = reference
    data_config = cases[case]["data_config"]
    loaded = load_checkpoint(checkpoint_of(reference, case))
    spec = loaded.preprocess
    # nothing known is dropped: crop mode, interpolation, mean/std all from the checkpoint
    assert (spec.crop_mode, spec.interpolation, spec.crop_pct) == (
        data_config["crop_mode"],
        data_config["interpolation"],
        data_config["crop_pct"],
    )
    assert spec.mean == pytest.approx(data_config["mean"]) and spec.std == pytest.approx(data_config["std"])
    assert set(loaded.preprocess_origins.values()) == {"checkpoint: config.json pretrained_cfg"}
    pixels = Preprocessor(spec).batch(photo_files(photos))
    assert_pixels(pixels, ref["pixels"], case)
    assert_same_predictions(eager_logits(loaded, pixels), ref["logits"])
    centre = Preprocessor(spec.replace(crop_mode="center")).batch(photo_files(photos))
    assert float(np.abs(centre - ref["pixels"]).max()) > 0.5  # the mode matters on these photos


# --------------------------------------------------------------------------- 1. torchvision


@pytest.mark.slow
def test_torchvision_state_dict_gets_its_weights_transforms(reference, photos, tmp_path):
    """Reference: torchvision (VisionTransformer, ViT_B_16_Weights.IMAGENET1K_V1.transforms())."""
    ref = ref_arrays(reference, "torchvision_b16")
    loaded = load_checkpoint(checkpoint_of(reference, "torchvision_b16"))
    assert any("ViT_B_16_Weights.IMAGENET1K_V1" in n and "preprocess:" in n for n in loaded.notes)
    art, manifest = export(checkpoint_of(reference, "torchvision_b16"), photos, tmp_path / "art")
    assert manifest["preprocess"]["style"] == "torchvision" and manifest["preprocess"]["shortest_edge"] == 256
    pixels, logits = predict(art, photos)
    assert_pixels(pixels, ref["pixels"], "torchvision IMAGENET1K_V1 transforms")
    assert_same_predictions(logits, ref["logits"])


def test_every_torchvision_vit_weights_transform_is_reproduced(reference, photos):
    """Reference: torchvision's documented transforms of every ViT weight (pixels)."""
    from vitdeploy.model import ViTConfig
    from vitdeploy.model.formats.torchvision.convert import torchvision_preprocess

    _, cases = reference
    checked = 0
    for case, info in cases.items():
        if "width" not in info:
            continue
        cfg = ViTConfig(
            image_size=info["image_size"],
            patch_size=info["patch"],
            width=info["width"],
            heads=16,
            depth=1,
            num_classes=0,
        )
        pre = torchvision_preprocess(cfg, Path("model.pth"))
        assert info["transforms"] in pre.notes[0]
        pixels = Preprocessor(pre.spec).batch(photo_files(photos))
        assert_pixels(pixels, ref_arrays(reference, case)["pixels"], info["transforms"])
        checked += 1
    assert checked >= 7  # B/16 (2), B/32, L/16 (2), L/32, H/14 (2)


# --------------------------------------------------------------------------- 2, 3. Hugging Face processors

transformers = pytest.importorskip("transformers", reason="transformers not installed")


HF_PROCESSORS = {  # name -> (processor class, kwargs, JSON edits after save_pretrained)
    "deit-int-256-crop-224": ("DeiTImageProcessorPil", {}, {"size": 256, "crop_size": 224}),
    "deit-hw-256-crop-224": ("DeiTImageProcessorPil", {}, {}),
    "vit-hw-224": ("ViTImageProcessorPil", {"size": {"height": 224, "width": 224}, "resample": 3}, {}),
    "vit-int-224": ("ViTImageProcessorPil", {}, {"size": 224}),
    "shortest-256-crop-224": (
        "ViTImageProcessorPil",
        {"size": {"shortest_edge": 256}, "do_center_crop": True, "crop_size": {"height": 224, "width": 224}},
        {},
    ),
    "shortest-256-longest-300-crop-224": (
        "ViTImageProcessorPil",
        {
            "size": {"shortest_edge": 256, "longest_edge": 300},
            "do_center_crop": True,
            "crop_size": {"height": 224, "width": 224},
        },
        {},
    ),
    "shortest-224-no-crop": ("ViTImageProcessorPil", {"size": {"shortest_edge": 224}}, {}),
    "shortest-224-longest-300-no-crop": (
        "ViTImageProcessorPil",
        {"size": {"shortest_edge": 224, "longest_edge": 300}},
        {},
    ),
}


def hf_folder(folder: Path, processor: str, hidden_act: str = "gelu", seed: int = 0):
    """A small HF ViT (random weights) at 224 px with ``processor``'s preprocessor_config.json."""
    import torch

    cls_name, kwargs, edits = HF_PROCESSORS[processor]
    config = transformers.ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=192,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=10,
        hidden_act=hidden_act,
    )
    torch.manual_seed(seed)
    model = randomize_(transformers.ViTForImageClassification(config), seed)
    model.save_pretrained(folder)
    getattr(transformers, cls_name)(**kwargs).save_pretrained(folder)
    path = folder / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edits}))
    processor_obj = transformers.AutoImageProcessor.from_pretrained(folder)
    assert processor_obj.backend == "pil"  # the reference this mirrors (torchvision is not installed here)
    return model, processor_obj


def hf_pixels(processor, photos: Path) -> list[np.ndarray]:
    return [
        processor(images=Image.open(p).convert("RGB"), return_tensors="np")["pixel_values"][0]
        for p in photo_files(photos)
    ]


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()


@pytest.mark.parametrize("processor", list(HF_PROCESSORS))
def test_hf_processor_sizes_match_transformers(processor, photos, tmp_path):
    """Reference: transformers' own image processor (AutoImageProcessor on the saved JSON, PIL backend)."""
    _, proc = hf_folder(tmp_path, processor)
    loaded = load_checkpoint(tmp_path)
    pre = Preprocessor(loaded.preprocess)
    ours = pre.batch(photo_files(photos))
    theirs = hf_pixels(proc, photos)
    compared = 0
    for name, mine, ref in zip([p.name for p in photo_files(photos)], ours, theirs, strict=True):
        if ref.shape != mine.shape:
            # shortest_edge without a crop: transformers keeps the aspect ratio, a tensor the 224 px model
            # cannot take; vitdeploy says it centre-crops instead
            assert processor.endswith("no-crop") and "without a centre crop" in " ".join(loaded.notes)
            continue
        assert_pixels(mine, ref, f"{processor} {name}")
        compared += 1
    assert compared >= (1 if processor.startswith("shortest") and processor.endswith("no-crop") else len(theirs))


def test_hf_centre_crop_offset_is_floored_like_transformers(photos, tmp_path):
    """transformers floors (size - crop) / 2 where torchvision rounds: the 640x427 photo lands on a half pixel."""
    _, proc = hf_folder(tmp_path, "shortest-256-crop-224")
    spec = load_checkpoint(tmp_path).preprocess
    rocket = next(p for p in photo_files(photos) if "rocket" in p.name)
    plan = resize_plan(Image.open(rocket).size, spec)
    assert (plan.size[0] - 224) % 2 == 1 and plan.left == (plan.size[0] - 224) // 2  # a half-pixel case, floored
    ours = Preprocessor(spec)(rocket)
    assert_pixels(ours, hf_pixels(proc, photos)[photo_files(photos).index(rocket)], "rocket")
    rounded = Preprocessor(spec.replace(style="torchvision", shortest_edge=256))(rocket)  # torchvision's rule
    assert float(np.abs(rounded - ours).max()) > 0.1


def test_hf_deit_processor_with_tanh_gelu_predicts_what_transformers_predicts(photos, tmp_path):
    """Reference: transformers (DeiT processor: 256x256 then crop 224; hidden_act gelu_pytorch_tanh).
    Eager here: the tanh GELU through ONNX, ORT and FP16 is exported in the timm test above."""
    import torch

    model, proc = hf_folder(tmp_path, "deit-int-256-crop-224", hidden_act="gelu_pytorch_tanh", seed=3)
    ref_pixels = np.stack(hf_pixels(proc, photos))
    with torch.no_grad():
        ref_logits = model(pixel_values=torch.from_numpy(ref_pixels)).logits.numpy()
    loaded = load_checkpoint(tmp_path)
    assert loaded.config.act == "gelu_tanh"
    assert loaded.preprocess_origins["resize_height"] == "checkpoint: preprocessor_config.json"
    pixels = Preprocessor(loaded.preprocess).batch(photo_files(photos))
    assert_pixels(pixels, ref_pixels, "DeiT processor")
    assert_same_predictions(eager_logits(loaded, pixels), ref_logits)
    # the aspect ratio matters here: keeping it (the old behaviour) gives other pixels
    kept = Preprocessor(loaded.preprocess.replace(resize_height=None, resize_width=None, shortest_edge=256))
    assert float(np.abs(kept.batch(photo_files(photos)) - ref_pixels).max()) > 0.5
