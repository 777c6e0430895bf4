"""The ViT relatives as ViTConfig data (issue 15): what the config accepts and refuses, what our own
format keeps, what the timm loader reads from tensors and config.json and what it refuses.
(Fidelity against timm itself: tests/model/test_vit_family.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import CheckpointError, ConfigError, VitDeployError
from vitdeploy.base.vit_schema import validate_vit_config
from vitdeploy.model import VisionTransformer, ViTConfig, load_checkpoint, save_checkpoint

safetensors_torch = pytest.importorskip("safetensors.torch")

TINY = dict(image_size=32, patch_size=8, width=32, depth=2, heads=2, num_classes=3)


@pytest.mark.parametrize(
    "bad, why",
    [
        (dict(class_token=False), "pool 'token' needs class_token"),
        (dict(distilled=True, pool="avg"), "distilled needs"),
        (dict(distilled=True, reg_tokens=2), "distilled needs"),
        (dict(pool="max"), "pool must be one of token, avg, token_avg"),
        (dict(pool="token_avg", class_token=False), "pool 'token_avg' needs class_token"),
        (dict(pool="token_avg", fc_norm=True), "pool 'token_avg' has no fc_norm"),
        (dict(distilled=True, pool="token_avg"), "distilled needs"),
        (dict(reg_tokens=-1), "reg_tokens must be an integer >= 0"),
    ],
)
def test_impossible_combinations_are_refused_by_config_and_schema(bad, why):
    with pytest.raises(ValueError, match=why):
        ViTConfig(**TINY, **bad)
    with pytest.raises(VitDeployError, match="model.json"):
        validate_vit_config({**TINY, **bad}, "model.json")


def _random(cfg: ViTConfig, seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


FAMILY = {
    "registers_no_prefix_pos_layer_scale": dict(reg_tokens=3, pos_embed_prefix=False, layer_scale=True),
    "avg_fc_norm_qk_norm_no_cls": dict(class_token=False, pool="avg", fc_norm=True, qk_norm=True),
    "distilled": dict(distilled=True),
    "avg_without_fc_norm": dict(pool="avg"),
    "dinov2_token_avg_registers": dict(pool="token_avg", reg_tokens=4, pos_embed_prefix=False, layer_scale=True),
}


def test_token_avg_head_reads_class_token_and_mean_patch_token():
    """pool token_avg: a head over 2 x width fed [class token, mean of the patch tokens] (registers left out)."""
    cfg = ViTConfig(**TINY, pool="token_avg", reg_tokens=2)
    model = _random(cfg)
    assert model.head.in_features == 2 * cfg.width and not cfg.reads_class_token_only
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_tokens(x)
        pooled = torch.cat([tokens[:, 0], tokens[:, 3:].mean(dim=1)], dim=1)
        assert torch.equal(model(x), model.head(pooled))


@pytest.mark.parametrize("name", FAMILY)
def test_our_format_keeps_every_family_field(name, tmp_path):
    cfg = ViTConfig(**TINY, **FAMILY[name])
    model = _random(cfg)
    save_checkpoint(tmp_path, model, ["a", "b", "c"], None, name)
    assert {
        k: v for k, v in json.loads((tmp_path / "model.json").read_text())["vit"].items() if k in FAMILY[name]
    } == FAMILY[name]
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == cfg
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model(x))


@pytest.mark.parametrize("pos_embed_prefix", [True, False])
def test_resampling_keeps_prefix_rows(pos_embed_prefix, tmp_path):
    cfg = ViTConfig(**TINY, reg_tokens=2, pos_embed_prefix=pos_embed_prefix)
    save_checkpoint(tmp_path, _random(cfg), ["a", "b", "c"], None, "r")
    loaded = load_checkpoint(tmp_path, image_size=48)
    assert loaded.model.pos_embed.shape[1] == 36 + (3 if pos_embed_prefix else 0)
    assert loaded.model(torch.randn(1, 3, 48, 48)).shape == (1, 3)


def _timm_file(tmp_path, cfg: ViTConfig, config: dict | None = None):
    state = {k: v.contiguous() for k, v in _random(cfg).state_dict().items()}
    if config is None:
        safetensors_torch.save_file(state, str(tmp_path / "m.safetensors"))
        return tmp_path / "m.safetensors"
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", **config}))
    return tmp_path


def test_timm_tensors_say_the_family_fields(tmp_path):
    cfg = ViTConfig(**TINY, reg_tokens=4, pos_embed_prefix=False, layer_scale=True, qk_norm=True)
    loaded = load_checkpoint(_timm_file(tmp_path, cfg), num_heads=2)
    assert loaded.config == cfg.replace(layer_norm_eps=1e-6)
    assert any("assumed class-token pooling" in n for n in loaded.notes)


def test_timm_pool_from_config_json_and_model_pool_checked(tmp_path):
    cfg = ViTConfig(**TINY, pool="avg")
    ckpt = _timm_file(tmp_path, cfg, {"global_pool": "avg", "model_args": {"num_heads": 2}})
    assert load_checkpoint(ckpt).config.pool == "avg"
    with pytest.raises(CheckpointError, match="config.json says global_pool 'avg' but model.pool is 'token'"):
        load_checkpoint(ckpt, pool="token")


@pytest.mark.parametrize(
    "config, feature",
    [
        ({"global_pool": "map"}, "global_pool 'map' is not supported"),
        ({"model_args": {"global_pool": "avgmax", "num_heads": 2}}, "global_pool 'avgmax' is not supported"),
        ({"model_args": {"pool_include_prefix": True, "num_heads": 2}}, "pool_include_prefix=True"),
    ],
)
def test_timm_poolings_the_network_cannot_run_are_refused_by_name(tmp_path, config, feature):
    with pytest.raises(CheckpointError, match=feature):
        load_checkpoint(_timm_file(tmp_path, ViTConfig(**TINY), config))


def test_model_pool_in_pipeline_yaml():
    assert parse_config({"model": {"pool": "avg"}}, None).model.pool == "avg"
    assert parse_config({"model": {"pool": "token_avg"}}, None).model.pool == "token_avg"
    with pytest.raises(ConfigError, match="model.pool"):
        parse_config({"model": {"pool": "mean"}}, None)


def test_model_pool_contradicting_a_stored_pooling_is_refused(tmp_path):
    save_checkpoint(tmp_path, _random(ViTConfig(**TINY)), ["a", "b", "c"], None, "t")
    with pytest.raises(CheckpointError, match="model.pool is 'avg' but the checkpoint stores 'token'"):
        load_checkpoint(tmp_path, pool="avg")


def test_token_avg_is_not_a_timm_pooling(tmp_path):
    with pytest.raises(CheckpointError, match="model.pool 'token_avg' is not a timm pooling"):
        load_checkpoint(_timm_file(tmp_path, ViTConfig(**TINY)), pool="token_avg", num_heads=2)
