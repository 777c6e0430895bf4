"""Checkpoint loading: timm / torchvision state dicts against reference forwards written here from the
raw tensors in each format's own naming (independent of the loader and of VisionTransformer),
strictness, refusal of unsafe pickles, detection, resampling and our own format's round trip."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitdeploy.base.errors import CheckpointError
from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.model import (
    LoadedCheckpoint,
    VisionTransformer,
    ViTConfig,
    detect_format,
    load_checkpoint,
    resample_pos_embed,
    save_checkpoint,
)
from vitdeploy.model.formats.hf.convert import hf_preprocess

safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-4


class NotATensor:
    """A custom class: a pickle holding one must be refused by weights_only loading."""

    def __init__(self) -> None:
        self.lr = 0.1


# --------------------------------------------------------------------------- random checkpoints


def _rand(gen: torch.Generator, *shape: int, std: float = 0.2) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def _norm(gen: torch.Generator, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    return 1.0 + _rand(gen, width, std=0.1), _rand(gen, width, std=0.1)


def make_timm_state(width=128, depth=2, patch=8, image=32, mlp=256, classes=5, qkv_bias=True, seed=0):
    """A timm vision_transformer state dict with random weights (large enough that attention matters)."""
    g = torch.Generator().manual_seed(seed)
    tokens = (image // patch) ** 2 + 1
    sd = {
        "patch_embed.proj.weight": _rand(g, width, 3, patch, patch, std=0.1),
        "patch_embed.proj.bias": _rand(g, width),
        "cls_token": _rand(g, 1, 1, width, std=0.5),
        "pos_embed": _rand(g, 1, tokens, width, std=0.5),
    }
    for i in range(depth):
        p = f"blocks.{i}."
        sd[p + "norm1.weight"], sd[p + "norm1.bias"] = _norm(g, width)
        sd[p + "attn.qkv.weight"] = _rand(g, 3 * width, width, std=0.15)
        if qkv_bias:
            sd[p + "attn.qkv.bias"] = _rand(g, 3 * width)
        sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"] = _rand(g, width, width, std=0.1), _rand(g, width)
        sd[p + "norm2.weight"], sd[p + "norm2.bias"] = _norm(g, width)
        sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"] = _rand(g, mlp, width, std=0.1), _rand(g, mlp)
        sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"] = _rand(g, width, mlp, std=0.1), _rand(g, width)
    sd["norm.weight"], sd["norm.bias"] = _norm(g, width)
    if classes:
        sd["head.weight"], sd["head.bias"] = _rand(g, classes, width), _rand(g, classes)
    return sd


def make_torchvision_state(width=128, depth=2, patch=8, image=32, mlp=256, classes=5, old_mlp_names=False, seed=1):
    """A torchvision VisionTransformer state dict with random weights, in torchvision's naming."""
    g = torch.Generator().manual_seed(seed)
    tokens = (image // patch) ** 2 + 1
    fc1, fc2 = ("linear_1", "linear_2") if old_mlp_names else ("0", "3")
    sd = {
        "class_token": _rand(g, 1, 1, width, std=0.5),
        "conv_proj.weight": _rand(g, width, 3, patch, patch, std=0.1),
        "conv_proj.bias": _rand(g, width),
        "encoder.pos_embedding": _rand(g, 1, tokens, width, std=0.5),
    }
    for i in range(depth):
        p = f"encoder.layers.encoder_layer_{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = _norm(g, width)
        sd[p + "self_attention.in_proj_weight"] = _rand(g, 3 * width, width, std=0.15)
        sd[p + "self_attention.in_proj_bias"] = _rand(g, 3 * width)
        sd[p + "self_attention.out_proj.weight"] = _rand(g, width, width, std=0.1)
        sd[p + "self_attention.out_proj.bias"] = _rand(g, width)
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = _norm(g, width)
        sd[p + f"mlp.{fc1}.weight"], sd[p + f"mlp.{fc1}.bias"] = _rand(g, mlp, width, std=0.1), _rand(g, mlp)
        sd[p + f"mlp.{fc2}.weight"], sd[p + f"mlp.{fc2}.bias"] = _rand(g, width, mlp, std=0.1), _rand(g, width)
    sd["encoder.ln.weight"], sd["encoder.ln.bias"] = _norm(g, width)
    sd["heads.head.weight"], sd["heads.head.bias"] = _rand(g, classes, width), _rand(g, classes)
    return sd


# --------------------------------------------------------------------------- reference forwards


def timm_reference(sd: dict, x: torch.Tensor, heads: int, eps: float = 1e-6) -> torch.Tensor:
    """timm's vision_transformer forward, straight from the state dict's tensors."""
    w = sd["patch_embed.proj.weight"]
    width, patch = w.shape[0], w.shape[-1]
    h = F.conv2d(x, w, sd["patch_embed.proj.bias"], stride=patch).flatten(2).transpose(1, 2)
    h = torch.cat([sd["cls_token"].expand(x.shape[0], 1, width), h], dim=1) + sd["pos_embed"]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    for i in range(depth):
        p = f"blocks.{i}."
        y = F.layer_norm(h, (width,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], eps)
        q, k, v = F.linear(y, sd[p + "attn.qkv.weight"], sd.get(p + "attn.qkv.bias")).split(width, dim=-1)
        h = h + F.linear(_mha(q, k, v, heads), sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"])
        y = F.layer_norm(h, (width,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], eps)
        y = F.linear(
            F.gelu(F.linear(y, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])),
            sd[p + "mlp.fc2.weight"],
            sd[p + "mlp.fc2.bias"],
        )
        h = h + y
    pooled = F.layer_norm(h, (width,), sd["norm.weight"], sd["norm.bias"], eps)[:, 0]
    return F.linear(pooled, sd["head.weight"], sd["head.bias"]) if "head.weight" in sd else pooled


def _mha(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, d = q.shape
    split = lambda t: t.reshape(b, n, heads, d // heads).transpose(1, 2)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads), dim=-1)
    return (attn @ v).transpose(1, 2).reshape(b, n, d)


def torchvision_reference(sd: dict, x: torch.Tensor, heads: int, eps: float = 1e-6) -> torch.Tensor:
    """torchvision's VisionTransformer forward: (L, N, E) nn.MultiheadAttention math from in_proj_*."""
    w = sd["conv_proj.weight"]
    width, patch = w.shape[0], w.shape[-1]
    h = F.conv2d(x, w, sd["conv_proj.bias"], stride=patch).reshape(x.shape[0], width, -1).permute(0, 2, 1)
    h = torch.cat([sd["class_token"].expand(x.shape[0], -1, -1), h], dim=1) + sd["encoder.pos_embedding"]
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(r"encoder\.layers\.encoder_layer_(\d+)\.", k))})
    for i in layers:
        p = f"encoder.layers.encoder_layer_{i}."
        y = F.layer_norm(h, (width,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps).transpose(0, 1)
        y, _ = F.multi_head_attention_forward(
            y,
            y,
            y,
            width,
            heads,
            sd[p + "self_attention.in_proj_weight"],
            sd[p + "self_attention.in_proj_bias"],
            None,
            None,
            False,
            0.0,
            sd[p + "self_attention.out_proj.weight"],
            sd[p + "self_attention.out_proj.bias"],
            training=False,
            need_weights=False,
        )
        h = h + y.transpose(0, 1)
        y = F.layer_norm(h, (width,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
        fc1 = "mlp.0" if p + "mlp.0.weight" in sd else "mlp.linear_1"
        fc2 = "mlp.3" if p + "mlp.3.weight" in sd else "mlp.linear_2"
        y = F.linear(
            F.gelu(F.linear(y, sd[p + fc1 + ".weight"], sd[p + fc1 + ".bias"])),
            sd[p + fc2 + ".weight"],
            sd[p + fc2 + ".bias"],
        )
        h = h + y
    pooled = F.layer_norm(h, (width,), sd["encoder.ln.weight"], sd["encoder.ln.bias"], eps)[:, 0]
    return F.linear(pooled, sd["heads.head.weight"], sd["heads.head.bias"])


def _images(n: int = 3, size: int = 32, seed: int = 7) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _logits(ck: LoadedCheckpoint, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ck.model(x)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# --------------------------------------------------------------------------- timm


def test_reference_forward_is_sensitive_to_heads():
    """Guard for the tests below: a wrong head count would change the logits well beyond TOL."""
    sd, x = make_timm_state(), _images()
    assert _max_diff(timm_reference(sd, x, heads=2), timm_reference(sd, x, heads=1)) > 100 * TOL


def test_timm_safetensors_matches_reference(tmp_path):
    sd = make_timm_state()
    path = tmp_path / "vit_tiny_test.safetensors"
    safetensors_torch.save_file(sd, str(path))
    ck = load_checkpoint(path, num_heads=2)
    assert ck.source_format == "timm" and detect_format(path) == "timm"
    cfg = ck.config
    assert (cfg.width, cfg.depth, cfg.heads, cfg.patch_size, cfg.image_size, cfg.mlp_dim, cfg.num_classes) == (
        128,
        2,
        2,
        8,
        32,
        256,
        5,
    )
    assert cfg.layer_norm_eps == 1e-6 and cfg.qkv_bias
    assert ck.labels == tuple(f"class_{i}" for i in range(5))
    assert ck.name == "vit_tiny_test"
    # no preprocessing in a bare state dict: timm's default pretrained_cfg for a ViT, said to be an assumption
    assert ck.preprocess == PreprocessSpec(
        style="timm",
        height=32,
        width=32,
        crop_pct=0.9,
        interpolation="bicubic",
        crop_mode="center",
        mean=(0.5,) * 3,
        std=(0.5,) * 3,
    )
    assert any("assumed timm's default" in n and "preprocess:" in n for n in ck.notes)
    assert not ck.model.training and all(p.dtype == torch.float32 for p in ck.model.parameters())
    x = _images()
    assert _max_diff(_logits(ck, x), timm_reference(sd, x, heads=2)) <= TOL


@pytest.mark.parametrize("wrapper", ["state_dict", "model", None])
def test_timm_torch_pickle_with_wrappers_and_fp16(tmp_path, wrapper):
    sd = make_timm_state(qkv_bias=False, seed=3)
    half = {k: v.half() for k, v in sd.items()}
    obj = (
        {wrapper: half, "epoch": 3, "arch": "vit"}
        if wrapper
        else {f"module._orig_mod.{k}": v for k, v in half.items()}
    )
    path = tmp_path / "checkpoint.pth"
    torch.save(obj, path)
    ck = load_checkpoint(path, num_heads=2)
    assert ck.source_format == "timm" and not ck.config.qkv_bias
    assert all(p.dtype == torch.float32 for p in ck.model.parameters())
    ref = {k: v.float() for k, v in half.items()}
    x = _images()
    assert _max_diff(_logits(ck, x), timm_reference(ref, x, heads=2)) <= TOL


def test_prefixed_safetensors_keys_are_detected(tmp_path):
    sd = make_timm_state()
    path = tmp_path / "ddp.safetensors"
    safetensors_torch.save_file({f"module.{k}": v for k, v in sd.items()}, str(path))
    x = _images()
    assert _max_diff(_logits(load_checkpoint(path, num_heads=2), x), timm_reference(sd, x, heads=2)) <= TOL


def test_timm_heads_from_standard_table_and_variant(tmp_path):
    # width 384 is DeiT-Small: 6 heads from the standard table
    sd = make_timm_state(width=384, depth=1, patch=16, image=32, mlp=1536, classes=3, seed=4)
    path = tmp_path / "small.safetensors"
    safetensors_torch.save_file(sd, str(path))
    ck = load_checkpoint(path)
    assert ck.config.heads == 6 and ck.heads_origin.startswith("library default (assumed)")
    assert any(
        "assumed 6 attention heads" in n and "model.num_heads" in n for n in ck.notes
    )  # said, with its override
    x = _images(2)
    assert _max_diff(_logits(ck, x), timm_reference(sd, x, heads=6)) <= TOL
    with pytest.raises(CheckpointError, match=r"does not match variant 'vit_base_patch16_224'.*width 384"):
        load_checkpoint(path, variant="vit_base_patch16_224")
    with pytest.raises(CheckpointError, match="unknown variant"):
        load_checkpoint(path, variant="resnet50")


def test_timm_nonstandard_width_needs_num_heads(tmp_path):
    sd = make_timm_state(width=256, depth=1, mlp=512, seed=5)
    path = tmp_path / "w256.safetensors"
    safetensors_torch.save_file(sd, str(path))
    with pytest.raises(
        CheckpointError, match=r"width 256 is not a standard variant's .*set model.num_heads in pipeline.yaml"
    ):
        load_checkpoint(path)
    ck = load_checkpoint(path, num_heads=4)
    assert ck.config.heads == 4 and ck.heads_origin == "pipeline.yaml: model.num_heads"
    x = _images(2)
    assert _max_diff(_logits(ck, x), timm_reference(sd, x, heads=4)) <= TOL


def test_timm_hub_directory_gives_preprocess_and_labels(tmp_path):
    sd = make_timm_state(classes=3)
    safetensors_torch.save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architecture": "vit_test",
                "num_classes": 3,
                "global_pool": "token",
                "model_args": {"num_heads": 2},
                "label_names": ["cat", "dog", "eel"],
                "pretrained_cfg": {
                    "input_size": [3, 32, 32],
                    "interpolation": "bicubic",
                    "crop_pct": 0.9,
                    "crop_mode": "center",
                    "mean": [0.5, 0.5, 0.5],
                    "std": [0.5, 0.5, 0.5],
                },
            }
        )
    )
    ck = load_checkpoint(tmp_path)
    assert ck.source_format == "timm" and ck.labels == ("cat", "dog", "eel") and ck.name == "vit_test"
    assert ck.preprocess == PreprocessSpec(
        style="timm", height=32, width=32, crop_pct=0.9, interpolation="bicubic", mean=(0.5,) * 3, std=(0.5,) * 3
    )
    x = _images(2)
    assert _max_diff(_logits(ck, x), timm_reference(sd, x, heads=2)) <= TOL


# --------------------------------------------------------------------------- torchvision


@pytest.mark.parametrize("old_mlp_names", [False, True])
def test_torchvision_matches_reference(tmp_path, old_mlp_names):
    sd = make_torchvision_state(old_mlp_names=old_mlp_names)
    path = tmp_path / "vit_b_16.pth"
    torch.save(sd, path)
    ck = load_checkpoint(path, num_heads=2)
    assert ck.source_format == "torchvision" and detect_format(path) == "torchvision"
    assert (ck.config.width, ck.config.depth, ck.config.heads, ck.config.num_classes) == (128, 2, 2, 5)
    assert ck.config.layer_norm_eps == 1e-6
    assert ck.preprocess is not None and ck.preprocess.mean == (0.485, 0.456, 0.406)
    x = _images()
    assert _max_diff(_logits(ck, x), torchvision_reference(sd, x, heads=2)) <= TOL


def test_torchvision_224_preprocess_is_imagenet_v1_recipe(tmp_path):
    sd = make_torchvision_state(width=64, depth=1, patch=16, image=224, mlp=128, classes=2)
    path = tmp_path / "tv.safetensors"
    safetensors_torch.save_file(sd, str(path))
    ck = load_checkpoint(path, num_heads=1)
    assert ck.preprocess == PreprocessSpec(
        style="torchvision",
        height=224,
        width=224,
        shortest_edge=256,
        interpolation="bilinear",
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
    )
    assert set(ck.preprocess_origins.values()) == {
        "library default: torchvision ViT_B_16_Weights.IMAGENET1K_V1.transforms()"
    }
    assert any(
        "assumed the convention of torchvision's ViT_B_16_Weights.IMAGENET1K_V1" in n and "preprocess:" in n
        for n in ck.notes
    )


# --------------------------------------------------------------------------- position embeddings


def test_resample_pos_embed_to_same_grid_is_identity():
    pos = make_timm_state()["pos_embed"]
    assert torch.equal(resample_pos_embed(pos, 4), pos)


def test_load_at_same_image_size_is_unchanged(tmp_path):
    sd = make_timm_state()
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(sd, str(path))
    ck = load_checkpoint(path, num_heads=2, image_size=32)
    assert torch.equal(ck.model.pos_embed, sd["pos_embed"])


def test_load_at_larger_image_size_resamples_pos_embed(tmp_path):
    sd = make_timm_state()
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(sd, str(path))
    ck = load_checkpoint(path, num_heads=2, image_size=48)
    assert ck.config.image_size == 48 and ck.config.grid == 6
    assert ck.model.pos_embed.shape == (1, 37, 128)
    assert torch.equal(ck.model.pos_embed[:, :1], sd["pos_embed"][:, :1])  # class token untouched
    x = _images(2, size=48)
    logits = _logits(ck, x)
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
    # the reference with the resampled table agrees: only the position table changed
    ref = dict(sd, pos_embed=resample_pos_embed(sd["pos_embed"], 6))
    assert _max_diff(logits, timm_reference(ref, x, heads=2)) <= TOL
    # a 4x4 grid resampled to 6x6 keeps the table's layout (corners map to corners roughly)
    grid = ck.model.pos_embed[0, 1:].reshape(6, 6, -1)
    old = sd["pos_embed"][0, 1:].reshape(4, 4, -1)
    assert F.cosine_similarity(grid[0, 0], old[0, 0], dim=0) > F.cosine_similarity(grid[0, 0], old[3, 3], dim=0)


def test_image_size_not_multiple_of_patch_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(make_timm_state(), str(path))
    with pytest.raises(CheckpointError, match="not a positive multiple of the patch size 8"):
        load_checkpoint(path, num_heads=2, image_size=36)


# --------------------------------------------------------------------------- strictness


def _save(tmp_path: Path, sd: dict, name: str = "m.safetensors") -> Path:
    path = tmp_path / name
    safetensors_torch.save_file(sd, str(path))
    return path


def test_extra_key_is_listed(tmp_path):
    sd = make_timm_state()
    sd["blocks.0.attn.gate.weight"] = torch.ones(128)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(_save(tmp_path, sd), num_heads=2)
    msg = str(err.value)
    assert (
        "unexpected keys (1)" in msg and "blocks.0.attn.gate.weight" in msg and str(tmp_path / "m.safetensors") in msg
    )
    assert "parts vitdeploy's ViT does not: gated attention" in msg  # the feature named


def test_missing_key_is_listed(tmp_path):
    sd = make_timm_state()
    del sd["blocks.1.norm2.bias"]
    with pytest.raises(CheckpointError, match=r"missing keys \(1, vitdeploy naming\): blocks\.1\.norm2\.bias"):
        load_checkpoint(_save(tmp_path, sd), num_heads=2)


def test_missing_key_in_torchvision_naming_is_listed(tmp_path):
    sd = make_torchvision_state()
    del sd["encoder.layers.encoder_layer_0.self_attention.in_proj_bias"]
    with pytest.raises(CheckpointError, match=r"blocks\.0\.attn\.qkv\.bias"):
        load_checkpoint(_save(tmp_path, sd), num_heads=2)


def test_wrong_shape_is_listed(tmp_path):
    sd = make_timm_state()
    sd["blocks.0.mlp.fc2.bias"] = torch.zeros(64)
    with pytest.raises(
        CheckpointError,
        match=r"shape mismatches \(1\): blocks\.0\.mlp\.fc2\.bias: checkpoint \(64,\) vs model \(128,\)",
    ):
        load_checkpoint(_save(tmp_path, sd), num_heads=2)


def test_long_key_lists_are_truncated(tmp_path):
    sd = make_timm_state()
    sd.update({f"extra.{i:02d}": torch.zeros(1) for i in range(20)})
    with pytest.raises(CheckpointError, match=r"unexpected keys \(20\): extra\.00, .*extra\.07 \.\.\. and 12 more"):
        load_checkpoint(_save(tmp_path, sd), num_heads=2)


def test_non_contiguous_blocks_are_refused(tmp_path):
    sd = {k: v for k, v in make_timm_state(depth=3).items() if not k.startswith("blocks.1.")}
    with pytest.raises(CheckpointError, match=r"layers \[1\] are missing"):
        load_checkpoint(_save(tmp_path, sd), num_heads=2)


def test_num_classes_must_match_no_silent_head_reset(tmp_path):
    path = _save(tmp_path, make_timm_state(classes=5))
    assert load_checkpoint(path, num_heads=2, num_classes=5).config.num_classes == 5
    with pytest.raises(CheckpointError, match="head has 5 classes but num_classes=10"):
        load_checkpoint(path, num_heads=2, num_classes=10)


def test_headless_timm_checkpoint_gives_features(tmp_path):
    sd = make_timm_state(classes=0)
    ck = load_checkpoint(_save(tmp_path, sd), num_heads=2)
    assert ck.config.num_classes == 0 and ck.labels == ()
    x = _images(2)
    assert _max_diff(_logits(ck, x), timm_reference(sd, x, heads=2)) <= TOL


def test_unsafe_pickle_is_refused(tmp_path):
    path = tmp_path / "train_state.pth"
    torch.save({"state_dict": make_timm_state(), "args": NotATensor()}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    msg = str(err.value)
    assert str(path) in msg and "refused as unsafe" in msg and "weights_only=True" in msg
    assert "safetensors" in msg and "NotATensor" in msg


def test_text_file_named_safetensors_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_text("this is not a checkpoint\n")
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="neither a safetensors file nor a PyTorch"):
        detect_format(path)


def test_truncated_safetensors_is_refused(tmp_path):
    path = _save(tmp_path, make_timm_state())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ".*corrupt"):
        load_checkpoint(path)


def test_corrupt_torch_zip_is_refused(tmp_path):
    path = tmp_path / "m.pth"
    torch.save(make_timm_state(), path)
    data = path.read_bytes()
    path.write_bytes(data[:200])
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ".*corrupt"):
        load_checkpoint(path)


def test_missing_path_is_named(tmp_path):
    path = tmp_path / "nope" / "model.safetensors"
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": no such file"):
        load_checkpoint(path)


def test_unknown_keys_are_an_unknown_format(tmp_path):
    path = _save(
        tmp_path, {"conv1.weight": torch.zeros(4, 3, 7, 7), "fc.weight": torch.zeros(10, 4)}, "resnet.safetensors"
    )
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": unknown checkpoint format.*conv1.weight"):
        detect_format(path)


def test_hf_state_dict_without_config_is_refused(tmp_path):
    path = _save(
        tmp_path, {"vit.embeddings.patch_embeddings.projection.weight": torch.zeros(8, 3, 4, 4)}, "w.safetensors"
    )
    with pytest.raises(CheckpointError, match="without its config.json"):
        load_checkpoint(path)


def test_hf_config_with_other_activation_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_act": "silu"}))
    safetensors_torch.save_file({"classifier.weight": torch.zeros(2, 8)}, str(tmp_path / "model.safetensors"))
    assert detect_format(tmp_path) == "hf"
    with pytest.raises(CheckpointError, match="hidden_act 'silu' is not supported"):
        load_checkpoint(tmp_path)


def test_directory_without_checkpoint_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path)) + ": not a checkpoint directory"):
        detect_format(tmp_path)


# --------------------------------------------------------------------------- HF preprocessing


def test_hf_preprocessor_config_mapping():
    where = Path("preprocessor_config.json")
    spec = hf_preprocess(
        {
            "do_resize": True,
            "size": {"height": 384, "width": 384},
            "resample": 3,
            "do_normalize": True,
            "image_mean": [0.1, 0.2, 0.3],
            "image_std": [0.4, 0.5, 0.6],
        },
        224,
        where,
    ).spec
    assert spec == PreprocessSpec(
        style="hf", height=384, width=384, interpolation="bicubic", mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6)
    )
    off = hf_preprocess(
        {
            "size": {"height": 32, "width": 32},
            "resample": 0,
            "do_normalize": False,
            "image_mean": [0.5] * 3,
            "image_std": [0.5] * 3,
        },
        32,
        where,
    ).spec
    assert off.interpolation == "nearest" and off.mean == (0.0, 0.0, 0.0) and off.std == (1.0, 1.0, 1.0)
    crop = hf_preprocess(
        {
            "size": {"shortest_edge": 256},
            "do_center_crop": True,
            "crop_size": {"height": 224, "width": 224},
            "resample": 2,
        },
        224,
        where,
    )
    assert crop.spec == PreprocessSpec(style="hf", height=224, width=224, shortest_edge=256, interpolation="bilinear")
    assert crop.origins["mean"] == "library default: transformers image processor"
    assert crop.origins["shortest_edge"] == "checkpoint: preprocessor_config.json"
    with pytest.raises(CheckpointError, match="unknown resample 9"):
        hf_preprocess({"resample": 9}, 224, where)


# --------------------------------------------------------------------------- our format


def _tiny_model(pos_embed: str = "learned", classes: int = 3) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(
        ViTConfig(
            image_size=32,
            patch_size=8,
            width=64,
            depth=2,
            heads=4,
            mlp_ratio=2.0,
            num_classes=classes,
            pos_embed=pos_embed,
        )
    ).eval()


@pytest.mark.parametrize("pos_embed", ["learned", "sincos"])
def test_save_then_load_round_trip(tmp_path, pos_embed):
    model = _tiny_model(pos_embed)
    spec = PreprocessSpec(style="timm", height=32, width=32, crop_pct=0.9, interpolation="bicubic")
    out = save_checkpoint(tmp_path / "art", model, ["a", "b", "c"], spec, "tiny")
    assert out == tmp_path / "art"
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.safetensors"]  # no temp files left
    meta = json.loads((out / "model.json").read_text())
    assert meta == {
        "format": "vitdeploy",
        "version": 1,
        "name": "tiny",
        "vit": model.cfg.to_dict(),
        "labels": ["a", "b", "c"],
        "preprocess": spec.to_dict(),
    }
    for target in (out, out / "model.json", out / "model.safetensors"):
        ck = load_checkpoint(target)
        assert ck.source_format == "vitdeploy" and detect_format(target) == "vitdeploy"
        assert ck.config == model.cfg and ck.labels == ("a", "b", "c") and ck.preprocess == spec and ck.name == "tiny"
        x = _images(2)
        with torch.no_grad():
            assert torch.equal(ck.model(x), model(x))


def test_round_trip_without_preprocess_and_resized(tmp_path):
    model = _tiny_model()
    save_checkpoint(tmp_path, model, ["a", "b", "c"], None, "tiny")
    ck = load_checkpoint(tmp_path, image_size=48)
    assert ck.preprocess is None and ck.config.image_size == 48 and ck.model.pos_embed.shape[1] == 37


def test_preprocess_follows_a_new_image_size(tmp_path):
    spec = PreprocessSpec(style="timm", height=32, width=32, crop_pct=0.9, interpolation="bicubic")
    save_checkpoint(tmp_path, _tiny_model(), ["a", "b", "c"], spec, "tiny")
    ck = load_checkpoint(tmp_path, image_size=64)
    assert ck.preprocess == spec.replace(height=64, width=64)


def test_save_refuses_wrong_label_count(tmp_path):
    with pytest.raises(CheckpointError, match="2 labels for a head with 3 classes"):
        save_checkpoint(tmp_path, _tiny_model(), ["a", "b"], None, "tiny")


def test_our_format_version_and_labels_are_checked(tmp_path):
    save_checkpoint(tmp_path, _tiny_model(), ["a", "b", "c"], None, "tiny")
    meta = json.loads((tmp_path / "model.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps({**meta, "version": 2}))
    with pytest.raises(CheckpointError, match="'version' = 2"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.json").write_text(json.dumps({**meta, "labels": ["a"]}))
    with pytest.raises(CheckpointError, match="'labels' has 1 entries but 'vit.num_classes' is 3"):
        load_checkpoint(tmp_path)


def test_our_format_weights_must_match_config(tmp_path):
    save_checkpoint(tmp_path, _tiny_model(), ["a", "b", "c"], None, "tiny")
    meta = json.loads((tmp_path / "model.json").read_text())
    meta["vit"]["depth"] = 3
    (tmp_path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"missing keys \(\d+, vitdeploy naming\): blocks\.2\."):
        load_checkpoint(tmp_path)


# --------------------------------------------------------------------------- what a checkpoint says, kept or refused


def _hub(tmp_path: Path, model_args: dict, pretrained_cfg: dict | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file(make_timm_state(classes=3), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architecture": "vit_test",
                "num_classes": 3,
                "model_args": {"num_heads": 2, **model_args},
                **({"pretrained_cfg": pretrained_cfg} if pretrained_cfg is not None else {}),
            }
        )
    )
    return tmp_path


def test_timm_hub_act_layer_is_used_or_refused(tmp_path):
    ck = load_checkpoint(_hub(tmp_path / "tanh", {"act_layer": "gelu_tanh"}))
    assert ck.config.act == "gelu_tanh" and ck.heads_origin == "checkpoint: config.json model_args.num_heads"
    with pytest.raises(CheckpointError, match="act_layer 'silu' is not supported"):
        load_checkpoint(_hub(tmp_path / "silu", {"act_layer": "silu"}))
    with pytest.raises(CheckpointError, match="config.json says act_layer 'gelu_tanh' but model.activation is 'gelu'"):
        load_checkpoint(tmp_path / "tanh", act="gelu")


def test_timm_crop_mode_kept_with_everything_else_and_unknown_refused(tmp_path):
    pcfg = {
        "input_size": [3, 32, 32],
        "interpolation": "bilinear",
        "crop_pct": 0.95,
        "crop_mode": "border",
        "mean": [0.1, 0.2, 0.3],
        "std": [0.4, 0.5, 0.6],
    }
    ck = load_checkpoint(_hub(tmp_path / "border", {}, pcfg))
    assert ck.preprocess == PreprocessSpec(
        style="timm",
        height=32,
        width=32,
        crop_pct=0.95,
        crop_mode="border",
        interpolation="bilinear",
        mean=(0.1, 0.2, 0.3),
        std=(0.4, 0.5, 0.6),
    )
    with pytest.raises(CheckpointError, match="crop_mode 'random' is not one of center, squash, border"):
        load_checkpoint(_hub(tmp_path / "bad", {}, {**pcfg, "crop_mode": "random"}))


def test_stored_values_contradicted_by_pipeline_keys_are_refused(tmp_path):
    hub = _hub(tmp_path, {})
    with pytest.raises(CheckpointError, match="config.json says num_heads 2 but model.num_heads is 4"):
        load_checkpoint(hub, num_heads=4)


def test_hf_processor_resizing_by_crop_pct_is_refused():
    with pytest.raises(CheckpointError, match="resizes by crop_pct"):
        hf_preprocess(
            {"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 224}, "crop_pct": 0.875},
            224,
            Path("preprocessor_config.json"),
        )
