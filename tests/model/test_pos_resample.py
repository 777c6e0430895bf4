"""The position table at another size, as the libraries resample it (vitdeploy/model/pos_resample.py), and
checkpoints loaded for several sizes against their library at two sizes per family."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitdeploy.base.errors import CheckpointError
from vitdeploy.model import load_checkpoint
from vitdeploy.model.pos_resample import bicubic_matrix

REF_PYTHON = Path(__file__).resolve().parents[2] / ".venv-ref" / "bin" / "python"


@pytest.mark.parametrize("antialias", [False, True])
def test_in_graph_matrices_resample_as_f_interpolate(antialias):
    torch.manual_seed(0)
    for grid in (4, 16, 37):
        table = torch.randn(1, 8, grid, grid)
        for side in (2, 3, 8, 16, 24, 32, 37, 48):
            ref = F.interpolate(table, size=(side, side), mode="bicubic", align_corners=False, antialias=antialias)
            m = bicubic_matrix(side, grid, antialias)
            ours = torch.einsum("ya,xb,cab->cyx", m, m, table[0])[None]
            # float32 rounding of the source coordinate (PyTorch's own float32 differs from its float64 as much)
            assert (ref - ours).abs().max() < 5e-5, (grid, side)


def _hf(kind: str, folder: Path):
    import transformers as tf

    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    if kind == "dinov2_with_registers":
        cfg = tf.Dinov2WithRegistersConfig(image_size=70, patch_size=14, num_register_tokens=4, **common)
        model = tf.Dinov2WithRegistersModel(cfg)
    elif kind == "dinov2":
        model = tf.Dinov2Model(tf.Dinov2Config(image_size=70, patch_size=14, **common))
    else:
        model = tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **common), add_pooling_layer=False)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.eval().save_pretrained(folder)
    return model


@pytest.mark.parametrize("kind, sizes", [("dinov2_with_registers", (28, 56)), ("dinov2", (42, 70)), ("vit", (24, 48))])
def test_transformers_models_match_at_two_sizes(kind, sizes, tmp_path):
    model = _hf(kind, tmp_path)
    loaded = load_checkpoint(tmp_path, image_sizes=sizes)
    assert loaded.config.dynamic_size
    assert loaded.config.pos_resample == ("bicubic_antialias" if kind == "dinov2_with_registers" else "bicubic")
    for side in sizes:
        x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
        with torch.no_grad():
            extra = {"interpolate_pos_encoding": True} if kind == "vit" else {}
            theirs = model(pixel_values=x, **extra).last_hidden_state[:, 0]
            ours = loaded.model.forward_features(x)
        assert (theirs - ours).abs().max() < 1e-4, side


_TIMM = """
import sys, numpy as np, timm, torch
from safetensors.torch import save_file
torch.manual_seed(0)
m = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=5, img_size=32, depth=2,
                      embed_dim=32, num_heads=2, dynamic_img_size=True).eval()
with torch.no_grad():
    for p in m.parameters():
        p.normal_(0, 0.2)
save_file({k: v.contiguous() for k, v in m.state_dict().items()}, sys.argv[1] + "/model.safetensors")
out = {}
for side in (48, 64):
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
    with torch.no_grad():
        out[f"x{side}"], out[f"y{side}"] = x.numpy(), m(x).numpy()
np.savez(sys.argv[1] + "/ref.npz", **out)
"""


def test_timm_dynamic_img_size_matches_at_two_sizes(tmp_path):
    if not REF_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{REF_PYTHON} missing")
        pytest.skip(f"{REF_PYTHON} missing (timm runs there)")
    subprocess.run(
        [str(REF_PYTHON), "-c", _TIMM, str(tmp_path)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    loaded = load_checkpoint(tmp_path / "model.safetensors", num_heads=2, image_sizes=(32, 48, 64))
    ref = np.load(tmp_path / "ref.npz")
    for side in (48, 64):
        with torch.no_grad():
            ours = loaded.model(torch.from_numpy(ref[f"x{side}"])).numpy()
        assert np.abs(ours - ref[f"y{side}"]).max() < 1e-4, side


def test_sizes_off_the_patch_and_one_size_libraries_are_refused_naming_what_works(tmp_path):
    _hf("vit", tmp_path)
    with pytest.raises(CheckpointError, match=r"image_sizes 30 not a multiple of the patch size 8; sizes that work"):
        load_checkpoint(tmp_path, image_sizes=(32, 30))
