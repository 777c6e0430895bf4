"""Issue 10, theme 3: impossible values in a checkpoint's config files are refused, naming key and file.

Hugging Face config.json / preprocessor_config.json, timm hub config.json and vitdeploy's
model.json, each through `vitdeploy export` (exit 2, one `error:` line, no manifest written) and
`load_checkpoint` (CheckpointError). The config is checked before any weight is read, so the
weights here are placeholders; valid checkpoints of each format load in test_checkpoints.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.bad_input import assert_one_error_line

from vitdeploy.base.errors import CheckpointError
from vitdeploy.cli import main
from vitdeploy.model.checkpoints import load_checkpoint

HF = {
    "model_type": "vit",
    "architectures": ["ViTForImageClassification"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "layer_norm_eps": 1e-12,
    "qkv_bias": True,
    "hidden_act": "gelu",
    "id2label": {"0": "a", "1": "b"},
}
HF_PP = {
    "do_resize": True,
    "size": {"height": 32, "width": 32},
    "resample": 2,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
OURS = {
    "format": "vitdeploy",
    "version": 1,
    "name": "t",
    "labels": ["a", "b"],
    "preprocess": None,
    "vit": {
        "image_size": 32,
        "patch_size": 8,
        "in_channels": 3,
        "width": 64,
        "depth": 2,
        "heads": 4,
        "mlp_ratio": 2.0,
        "qkv_bias": True,
        "layer_norm_eps": 1e-6,
        "num_classes": 2,
        "pos_embed": "learned",
    },
}
TIMM = {
    "architecture": "vit_tiny_patch16_224",
    "num_classes": 2,
    "label_names": ["a", "b"],
    "pretrained_cfg": {
        "input_size": [3, 32, 32],
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
    },
    "model_args": {"num_heads": 4},
}


def _put(data: dict, key: str, value) -> dict:
    data = json.loads(json.dumps(data))
    node = data
    *parents, last = key.split(".")
    for p in parents:
        node = node[p]
    if value is _DEL:
        del node[last]
    else:
        node[last] = value
    return data


_DEL = object()

# (format, file, key, value, what the message must say)
CASES = [
    ("hf", "config.json", "num_attention_heads", 0, "'num_attention_heads' = 0"),
    ("hf", "config.json", "hidden_size", 0, "'hidden_size' = 0"),
    ("hf", "config.json", "hidden_size", "768", "'hidden_size' = '768'"),
    ("hf", "config.json", "hidden_size", None, "'hidden_size' = None"),
    ("hf", "config.json", "hidden_size", 66, "hidden_size 66 is not divisible by num_attention_heads 4"),
    ("hf", "config.json", "num_hidden_layers", 10**9, "'num_hidden_layers' = 1000000000"),
    ("hf", "config.json", "num_hidden_layers", 2.0, "'num_hidden_layers' = 2.0"),
    ("hf", "config.json", "intermediate_size", -5, "'intermediate_size' = -5"),
    ("hf", "config.json", "num_channels", True, "'num_channels' = True"),
    ("hf", "config.json", "image_size", 30, "image_size 30 is not a multiple of patch_size 8"),
    ("hf", "config.json", "patch_size", 0, "'patch_size' = 0"),
    ("hf", "config.json", "layer_norm_eps", math.nan, "'layer_norm_eps' = nan"),
    ("hf", "config.json", "layer_norm_eps", -1, "'layer_norm_eps' = -1"),
    ("hf", "config.json", "qkv_bias", "yes", "'qkv_bias' = 'yes'"),
    ("hf", "config.json", "id2label", {"0": 5, "1": "b"}, "'id2label.0' = 5"),
    ("hf", "preprocessor_config.json", "image_mean", [math.nan, 0.5, 0.5], "'image_mean' = [nan, 0.5, 0.5]"),
    ("hf", "preprocessor_config.json", "image_std", [0.5, 0, 0.5], "'image_std'"),
    ("hf", "preprocessor_config.json", "rescale_factor", 0, "'rescale_factor' = 0"),
    ("hf", "preprocessor_config.json", "size", -1, "'size' = -1"),
    ("hf", "preprocessor_config.json", "size", {"height": 0, "width": 32}, "'size.height' = 0"),
    ("hf", "preprocessor_config.json", "resample", 9, "'resample' = 9"),
    ("hf", "preprocessor_config.json", "do_normalize", "no", "'do_normalize' = 'no'"),
    ("vitdeploy", "model.json", "vit.heads", 0, "'vit.heads' = 0"),
    ("vitdeploy", "model.json", "vit.width", "64", "'vit.width' = '64'"),
    ("vitdeploy", "model.json", "vit.image_size", None, "'vit.image_size' = None"),
    ("vitdeploy", "model.json", "vit.depth", 0, "'vit.depth' = 0"),
    ("vitdeploy", "model.json", "vit.width", 66, "width 66 is not divisible by heads 4"),
    ("vitdeploy", "model.json", "vit.patch_size", 5, "image_size 32 is not a multiple of patch_size 5"),
    ("vitdeploy", "model.json", "vit.num_classes", -1, "'vit.num_classes' = -1"),
    ("vitdeploy", "model.json", "vit.mlp_ratio", math.inf, "'vit.mlp_ratio' = inf"),
    ("vitdeploy", "model.json", "vit.colour", "red", "unknown key 'vit.colour'"),
    ("vitdeploy", "model.json", "labels", [0, 1], "'labels[0]' = 0"),
    ("vitdeploy", "model.json", "labels", ["a", "b", "c"], "'labels' has 3 entries but 'vit.num_classes' is 2"),
    ("timm", "config.json", "pretrained_cfg.input_size", [3, 0, 32], "'pretrained_cfg.input_size[1]' = 0"),
    ("timm", "config.json", "pretrained_cfg.crop_pct", 0, "'pretrained_cfg.crop_pct' = 0"),
    ("timm", "config.json", "pretrained_cfg.mean", [math.nan, 0, 0], "'pretrained_cfg.mean[0]' = nan"),
    ("timm", "config.json", "pretrained_cfg.std", [0.5, 0.5, 0], "'pretrained_cfg.std[2]' = 0"),
    ("timm", "config.json", "pretrained_cfg.interpolation", "cubic", "'pretrained_cfg.interpolation' = 'cubic'"),
    ("timm", "config.json", "model_args.num_heads", 0, "'model_args.num_heads' = 0"),
    ("timm", "config.json", "model_args.num_heads", "4", "'model_args.num_heads' = '4'"),
    ("timm", "config.json", "label_names", [1, 2], "'label_names[0]' = 1"),
    ("timm", "config.json", "num_classes", -1, "'num_classes' = -1"),
]


def _safetensors(path: Path, keys: list[str]) -> None:
    from safetensors.numpy import save_file

    save_file({k: np.zeros((2, 2), np.float32) for k in keys}, str(path))


def make_checkpoint(root: Path, fmt: str, file: str, key: str, value) -> Path:
    d = root / "ckpt"
    d.mkdir()
    if fmt == "hf":
        (d / "config.json").write_text(json.dumps(_put(HF, key, value) if file == "config.json" else HF))
        (d / "preprocessor_config.json").write_text(
            json.dumps(_put(HF_PP, key, value) if file != "config.json" else HF_PP)
        )
        (d / "model.safetensors").write_bytes(b"placeholder: never read")
    elif fmt == "vitdeploy":
        (d / "model.json").write_text(json.dumps(_put(OURS, key, value)))
        (d / "model.safetensors").write_bytes(b"placeholder: never read")
    else:
        (d / "config.json").write_text(json.dumps(_put(TIMM, key, value)))
        _safetensors(d / "model.safetensors", ["patch_embed.proj.weight", "blocks.0.norm1.weight"])
    return d


@pytest.mark.parametrize("fmt,file,key,value,needle", CASES, ids=[f"{c[0]}-{c[2]}={c[3]!r}"[:60] for c in CASES])
def test_impossible_checkpoint_config_is_refused_naming_key_and_file(tmp_path, fmt, file, key, value, needle):
    ckpt = make_checkpoint(tmp_path, fmt, file, key, value)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    assert needle in str(info.value) and str(ckpt / file) in str(info.value)

    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(f"model: {{checkpoint: {ckpt}}}\nexport: {{output_dir: {tmp_path / 'out'}}}\n")
    res = CliRunner().invoke(main, ["export", "-c", str(cfg), "--engine", "skip"], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert_one_error_line(res.stderr, needle, str(ckpt / file))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_base_configs_themselves_pass_validation(tmp_path):
    """The cases above fail for their one bad value: the unedited configs validate."""
    from vitdeploy.model.config_schema import check_checkpoint_config

    for fmt, meta in (("hf", HF), ("vitdeploy", OURS), ("timm", TIMM)):
        d = tmp_path / fmt
        d.mkdir()
        (d / "preprocessor_config.json").write_text(json.dumps(HF_PP))
        check_checkpoint_config(fmt, meta, d)


def test_vit_config_built_directly_with_zero_heads_is_a_value_error_not_a_crash():
    from vitdeploy.model.vit import ViTConfig

    for bad in ({"heads": 0}, {"width": "768"}, {"patch_size": 0}, {"depth": None}):
        with pytest.raises(ValueError, match="sizes must be positive integers"):
            ViTConfig(**bad)
