"""timm's EVA-02 (timm/models/eva.py; its key conversion in vitdeploy/model/formats/timm/convert.py) exports and
predicts what timm predicts, at two image sizes: the 2-D rotary attention (its positions scaled to timm's
ref_feat_shape at every grid), separate q/k/v with q and v biases, SwiGLU with separate gate and value layers, the
norm inside the MLP, EVA-CLIP's norm on the attention output, average pooling + fc_norm or the class token.

Reference: timm in the reference environment (``tests/helpers/library_reference.py ... eva``, once per session):
each model at tiny width (64, 2 heads, 2 blocks, 112 px) with random weights, saved as timm saves it, and run by
timm with ``dynamic_img_size=True`` on timm's own preprocessing of real photos at 112 and 168 px. Ours: ``vitdeploy
export`` with ``export.image_sizes`` (FP32, FP16 and INT8, each behind its gate), then ``vitdeploy predict --json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.library_fidelity import (
    assert_pixels,
    export,
    photo_files,
    photos,  # noqa: F401 (the fixture)
    run_reference,
)

from vitdeploy.base.errors import CheckpointError
from vitdeploy.cli import main as cli_main
from vitdeploy.model import load_checkpoint
from vitdeploy.runtime.postprocess import softmax
from vitdeploy.runtime.predictor import Predictor

SIZES = (112, 168)  # grid 8 and 12 at patch 14: neither is the 16 x 16 grid the rotary positions are scaled to
TOL = 1e-4
GATES = ("validate-onnx", "validate-ort-optimized", "validate-fp16", "validate-int8")


@pytest.fixture(scope="session")
def eva(photos, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("eva")
    return out, run_reference(photos, out, "eva")


def _case(eva, case: str) -> tuple[Path, dict[str, np.ndarray]]:
    out, cases = eva
    with np.load(out / case / "reference.npz") as data:
        return out / case / cases[case]["checkpoint"], {k: data[k] for k in data.files}


def _export_every_stage(ckpt: Path, photos: Path, out: Path, **model) -> tuple[Path, dict]:
    """The export at both sizes with every ONNX stage shipped (INT8 too, whatever this CPU's speed-up)."""
    art, manifest = export(
        ckpt,
        photos,
        out,
        model=model,
        export={
            "batch": {"min": 1, "opt": 2, "max": 4},
            "image_sizes": list(SIZES),
            "int8": {"min_speedup": 0, "min_calibration_images": 6},
        },
    )
    for gate in GATES:
        assert manifest["validation"][gate]["passed"], gate
        assert sorted(manifest["validation"][gate]["per_size"]) == ["168"], gate  # the base size, then the other
    assert {"onnx", "onnx-ort", "onnx-fp16", "onnx-int8"} <= set(manifest["artifacts"])
    return art, manifest


def _predict_json(art: Path, photos: Path, side: int, *extra: str) -> list[dict]:
    files = [str(p) for p in photo_files(photos)]
    res = CliRunner().invoke(
        cli_main, ["predict", *files, "-a", str(art), "-b", "ort", "--json", "--image-size", str(side), *extra]
    )
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines()]


def _check_pixels(art: Path, photos: Path, ref: dict[str, np.ndarray], side: int) -> None:
    with Predictor.from_artifacts(art, backend="ort") as base:
        assert_pixels(base.at_size(side).preprocess(photo_files(photos)), ref[f"pixels_{side}"], f"timm at {side}")


@pytest.mark.integration
@pytest.mark.slow
def test_eva02_classifier_predicts_what_timm_predicts_at_two_sizes(eva, photos, tmp_path):
    """EVA-02 B/L's structure (q/k/v, fc1_g / fc1_x, mlp.norm), a timm hub folder, classifier."""
    ckpt, ref = _case(eva, "timm_eva02_base_cls")
    art, manifest = _export_every_stage(ckpt, photos, tmp_path / "art")
    vit = manifest["model"]["vit"]
    assert (vit["rope"], vit["rope_grid"], vit["mlp_norm"], vit["mlp"], vit["pool"]) == (
        True,
        16,
        True,
        "swiglu",
        "avg",
    )
    # each block's attention fused over the rotated queries and keys (its INT8 graph writes it out again)
    assert manifest["export"]["ort_optimize"]["fused"].get("MultiHeadAttention") == 2
    assert manifest["validation"]["validate-int8"]["flips"] == []  # a classifier's INT8: judged by its top-1 flips
    for side in SIZES:
        _check_pixels(art, photos, ref, side)
        records = _predict_json(art, photos, side, "-k", "10")
        probs = np.zeros((len(records), 10), np.float32)
        for row, rec in zip(probs, records):
            for top in rec["top_k"]:
                row[top["index"]] = top["score"]
        want = softmax(ref[f"logits_{side}"])
        assert float(np.abs(probs - want).max()) <= TOL, side
        assert [r["index"] for r in records] == want.argmax(1).tolist()


@pytest.mark.integration
@pytest.mark.slow
def test_eva02_embedding_from_a_bare_state_dict_matches_timm_at_two_sizes(eva, photos, tmp_path):
    """EVA-02 Ti/S's structure (qkv + q_bias / v_bias, packed SwiGLU), headless, a bare state dict: the architecture
    named (model.variant) since no tensor says the attention is rotary; the vector is timm's ``model(x)``."""
    ckpt, ref = _case(eva, "timm_eva02_tiny_embed")
    with pytest.raises(CheckpointError, match="set model.variant to its timm architecture"):
        load_checkpoint(ckpt)
    art, manifest = _export_every_stage(ckpt, photos, tmp_path / "art", variant="eva02_tiny_patch14_224", num_heads=2)
    assert manifest["output"]["kind"] == "embedding" and manifest["preprocess"]["mean"][0] == 0.48145466
    assert manifest["validation"]["validate-int8"]["metrics"]["cosine"] >= 0.99  # an embedding's: by cosine
    for side in SIZES:
        _check_pixels(art, photos, ref, side)
        vectors = np.array([rec["embedding"] for rec in _predict_json(art, photos, side)], np.float32)
        assert float(np.abs(vectors - ref[f"logits_{side}"]).max()) <= TOL, side


@pytest.mark.integration
def test_eva_clip_tower_matches_timm_at_two_sizes_eagerly(eva, photos):
    """EVA-CLIP's image tower (the norm on the attention output, class-token pooling, the projection as timm's
    head), patch 16: eager, on timm's pixels, at both sizes from one load, and built for the second size alone."""
    import torch

    ckpt, ref = _case(eva, "timm_eva02_clip")
    loaded = load_checkpoint(ckpt, image_sizes=(128, 192))
    assert (loaded.config.attn_norm, loaded.config.pool, loaded.config.num_classes) == (True, "token", 32)
    fixed = load_checkpoint(ckpt, image_size=192)  # one other size (model.image_size): the same answers
    assert not fixed.config.dynamic_size and fixed.config.image_size == 192
    for model, side in ((loaded.model, 128), (loaded.model, 192), (fixed.model, 192)):
        with torch.no_grad():
            ours = model(torch.from_numpy(ref[f"pixels_{side}"])).numpy()
        assert float(np.abs(ours - ref[f"logits_{side}"]).max()) <= TOL, side


def _eva_like(folder: Path, config: dict | None = None) -> Path:
    """An EVA-shaped file (q/v biases): refused before any shape is read."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {"patch_embed.proj.weight": torch.zeros(8, 3, 14, 14), "blocks.0.attn.q_bias": torch.zeros(8)},
        str(folder / "model.safetensors"),
    )
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
        return folder
    return folder / "model.safetensors"


@pytest.mark.parametrize(
    "config, says",
    [
        ({"architecture": "eva02_enormous_patch14_clip_224"}, "has post-norm blocks (timm use_post_norm"),
        ({"architecture": "vit_medium_patch16_rope_reg1_gap_256"}, "not other rotary schemes"),
        (
            {"architecture": "eva02_base_patch14_224", "model_args": {"rope_type": "mixed"}},
            "model_args rope_type='mixed' is not supported",
        ),
        (
            {"architecture": "eva02_base_patch14_224", "model_args": {"ref_feat_shape": [16, 24]}},
            "ref_feat_shape [16, 24] is not square",
        ),
    ],
)
def test_eva_models_vitdeploy_cannot_run_are_refused_in_one_line(config, says, tmp_path):
    with pytest.raises(CheckpointError, match=r".*") as info:
        load_checkpoint(_eva_like(tmp_path / "ck", config))
    assert says in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- every architecture timm ships

DOCS = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"
TABLE_START, TABLE_END = "<!-- timm-eva-architectures: generated by tests/model/test_timm_eva.py -->", "<!-- end -->"


@pytest.fixture(scope="session")
def eva_archs(photos, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("eva_archs")
    return out, run_reference(photos, out, "eva_archs")


def _support_row(folder: Path, ref: dict[str, np.ndarray], arch: str) -> str:
    """The docs table's row of one architecture: what vitdeploy understands it as (its output equal to timm's
    within 1e-4), or its one-line refusal."""
    import torch

    try:
        loaded = load_checkpoint(folder)
    except CheckpointError as exc:
        message = str(exc)
        assert "\n" not in message
        return f"| `{arch}` | refused: {message.split(': ', 1)[1].split(';')[0]} |"
    with torch.no_grad():
        ours = loaded.model(torch.from_numpy(ref["pixels"])).numpy()
    assert float(np.abs(ours - ref["logits"]).max()) <= TOL, arch
    cfg = loaded.config
    out = (
        "embedding"
        if not cfg.num_classes
        else f"head of {cfg.num_classes}" + (" (the CLIP projection)" if "_clip_" in arch else "")
    )
    summary = cfg.family_summary() or "the paper's ViT"
    return f"| `{arch}` | loads: {summary}; {out} |"


@pytest.mark.integration
@pytest.mark.slow
def test_every_timm_eva_architecture_loads_exactly_or_is_refused_in_one_line(eva_archs):
    """Every architecture timm registers as eva02_* / eva_* (its structure at tiny width, one block, its own
    size and default head): loaded, its output equal to timm's, or refused in one line; docs/checkpoints.md's table
    is this one (on a failure, paste the table printed)."""
    out, cases = eva_archs
    rows = []
    for arch in sorted(cases):
        with np.load(out / arch / "reference.npz") as data:
            rows.append(_support_row(out / arch, {k: data[k] for k in data.files}, arch))
    refused = [r for r in rows if "| refused:" in r]
    assert len(rows) >= 18 and [r.split("`")[1] for r in refused] == ["eva02_enormous_patch14_clip_224"]
    table = "\n".join(["| timm architecture | vitdeploy |", "|---|---|", *rows])
    docs = DOCS.read_text(encoding="utf-8")
    assert docs.split(TABLE_START)[1].split(TABLE_END)[0].strip() == table, "docs/checkpoints.md:\n" + table
