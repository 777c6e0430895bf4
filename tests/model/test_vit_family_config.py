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
        (dict(mlp="geglu"), "mlp must be one of gelu, swiglu"),
        (dict(mlp="swiglu", act="gelu_tanh"), "the swiglu MLP runs SiLU"),
        (dict(pool="map", class_token=False, mlp="swiglu"), "pool 'map' .* needs mlp 'gelu'"),
        (dict(image_size=36), "image_size 36 is not a multiple of patch_size 8"),
        (dict(image_size=4, drop_remainder=True), "image_size 4 is smaller than one patch"),
        (dict(image_size=36, drop_remainder=True, pos_resample="bicubic"), "drop_remainder .* cannot go with"),
    ],
)
def test_impossible_combinations_are_refused_by_config_and_schema(bad, why):
    with pytest.raises(ValueError, match=why):
        ViTConfig(**{**TINY, **bad})
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
    "swiglu": dict(mlp="swiglu", mlp_ratio=2.5, layer_scale=True),
    "siglip_map": dict(class_token=False, pool="map"),
    "map_with_class_token_fc_norm": dict(pool="map", fc_norm=True),
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


def test_map_pool_is_a_probe_attending_over_the_patch_tokens_then_norm_and_mlp():
    """pool map (SigLIP): one learned query over the patch tokens (prefix tokens left out, as timm pools), then
    ``x + mlp(norm(x))``; written out here with torch's own MultiheadAttention, transformers' way."""
    cfg = ViTConfig(**TINY, pool="map", reg_tokens=1)
    model = _random(cfg)
    pool, x = model.attn_pool, torch.randn(2, 3, 32, 32)
    mha = torch.nn.MultiheadAttention(cfg.width, cfg.heads, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([pool.q.weight, pool.kv.weight]))
        mha.in_proj_bias.copy_(torch.cat([pool.q.bias, pool.kv.bias]))
        mha.out_proj.load_state_dict(pool.proj.state_dict())
        patches = model.forward_tokens(x)[:, 2:]
        attended = mha(pool.latent.expand(2, -1, -1), patches, patches)[0]
        pooled = (attended + pool.mlp(pool.norm(attended)))[:, 0]
        assert torch.allclose(model(x), model.head(pooled), atol=1e-6)
    assert not cfg.reads_class_token_only and "attention pooling" in cfg.family_summary()


def test_an_image_off_the_patch_grid_never_reads_its_last_rows_and_columns(tmp_path):
    """drop_remainder (SigLIP so400m/14 at 384 px): the patch convolution reads image_size // patch patches a side;
    model.json states it, and loads back the same."""
    cfg = ViTConfig(**{**TINY, "image_size": 36}, class_token=False, pool="map", drop_remainder=True)
    assert (cfg.grid, cfg.to_dict()["drop_remainder"]) == (4, True) and "drop_remainder" not in ViTConfig().to_dict()
    model = _random(cfg)
    save_checkpoint(tmp_path, model, ["a", "b", "c"], None, "off-grid")
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == cfg and "last 4 rows and columns never read" in cfg.family_summary()
    x = torch.randn(2, 3, 36, 36)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model(x[..., :32, :32]))


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
        ({"global_pool": "map"}, "global_pool is 'map' .attention pooling. but the checkpoint has no attention pool"),
        ({"global_pool": "prr"}, "global_pool 'prr' is not supported"),
        ({"model_args": {"global_pool": "avgmax", "num_heads": 2}}, "global_pool 'avgmax' is not supported"),
        ({"model_args": {"pool_include_prefix": True, "num_heads": 2}}, "pool_include_prefix=True"),
    ],
)
def test_timm_poolings_the_network_cannot_run_are_refused_by_name(tmp_path, config, feature):
    with pytest.raises(CheckpointError, match=feature):
        load_checkpoint(_timm_file(tmp_path, ViTConfig(**TINY), config))


def test_timm_siglip_architecture_gives_what_timm_registers_beside_the_sizes(tmp_path):
    """A SigLIP hub config.json names the architecture; timm builds vit_giantopt_* with 16 heads and tanh GELU (its
    registration, not model_args): both followed, and said to come from the architecture."""
    cfg = ViTConfig(**{**TINY, "heads": 16}, class_token=False, pool="map", act="gelu_tanh")
    config = {"architecture": "vit_giantopt_patch16_siglip_256", "global_pool": "map"}
    loaded = load_checkpoint(_timm_file(tmp_path, cfg, config))
    assert loaded.config == cfg.replace(layer_norm_eps=1e-6)
    assert loaded.heads_origin.endswith("config.json architecture vit_giantopt_patch16_siglip_256")


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


def test_swiglu_mlp_is_silu_of_the_first_half_times_the_second():
    """timm SwiGLUPacked / transformers Dinov2SwiGLUFFN: fc1 writes 2 x mlp_dim, SiLU gates the first half."""
    cfg = ViTConfig(**TINY, mlp="swiglu", mlp_ratio=2.5)
    mlp = _random(cfg).blocks[0].mlp
    assert (mlp.fc1.out_features, mlp.fc2.in_features) == (cfg.fc1_dim, cfg.mlp_dim) == (160, 80)
    x = torch.randn(2, 5, cfg.width)
    with torch.no_grad():
        h = mlp.fc1(x)
        assert torch.allclose(mlp(x), mlp.fc2(torch.nn.functional.silu(h[..., :80]) * h[..., 80:]))


def test_dinov2_giant_is_one_size_in_every_format(tmp_path):
    """ViT-g/14 as DINOv2 ships it: our variant, transformers' config.json (hidden width by DINOv2's rule) and
    timm's SwiGLUPacked tensors (mlp_ratio 2.66667 * 2: fc1 8192 rows) are the same network."""
    from vitdeploy.base.vit_schema import VARIANTS, dinov2_swiglu_hidden
    from vitdeploy.model.formats.hf.convert import hf_vit_config
    from vitdeploy.model.formats.shared import variant_template
    from vitdeploy.model.formats.timm.convert import timm_arch_name, timm_vit_config

    giant = VARIANTS["vit_giant_patch14_dinov2"]
    dims = (giant.width, giant.depth, giant.heads, giant.mlp_dim, giant.fc1_dim, giant.mlp)
    assert dims == (1536, 40, 24, 4096, 8192, "swiglu")
    assert dinov2_swiglu_hidden(1536, 4) == 4096 == int(1536 * 2.66667 * 2) // 2
    hub = {"model_type": "dinov2", "hidden_size": 1536, "num_hidden_layers": 40, "num_attention_heads": 24}
    hf = hf_vit_config({**hub, "patch_size": 14, "mlp_ratio": 4, "use_swiglu_ffn": True}, 0, tmp_path)
    assert (hf.width, hf.depth, hf.heads, hf.mlp_dim, hf.mlp) == dims[:4] + ("swiglu",)
    # one giant block's shapes (empty tensors: only shapes are read); heads from the standard width
    shapes = {
        "cls_token": (1, 1, 1536),
        "reg_token": (1, 4, 1536),
        "pos_embed": (1, 37 * 37, 1536),
        "patch_embed.proj.weight": (1536, 3, 14, 14),
        "blocks.0.attn.qkv.bias": (3 * 1536,),
        "blocks.0.mlp.fc1.weight": (8192, 1536),
        "blocks.0.mlp.fc2.weight": (1536, 4096),
        "blocks.0.ls1.gamma": (1536,),
    }
    state = {k: torch.empty(v) for k, v in shapes.items()}
    cfg, origin, _ = timm_vit_config(state, tmp_path, None)
    assert (cfg.width, cfg.heads, cfg.mlp_dim, cfg.mlp, cfg.reg_tokens, cfg.image_size) == (
        1536, 24, 4096, "swiglu", 4, 518
    )  # fmt: skip
    assert "vit_giant" in origin and timm_arch_name(cfg) == "vit_giant_patch14_reg4_dinov2"
    hub_args = {"architecture": "vit_giant_patch14_reg4_dinov2", "model_args": {"act_layer": "silu"}}
    assert timm_vit_config(state, tmp_path, None, hub_args)[0] == cfg  # SwiGLUPacked's SiLU, not a GELU's flavour
    gelu_mlp = {**state, "blocks.0.mlp.fc1.weight": torch.empty(4096, 1536)}
    with pytest.raises(CheckpointError, match="act_layer 'silu' is not supported"):  # SiLU only gates a SwiGLU
        timm_vit_config(gelu_mlp, tmp_path, None, hub_args)
    for name in ("giant", "g/14", "vit_giant_patch14_dinov2.lvd142m", "vit_giant_patch14_reg4_dinov2"):
        assert variant_template(name).mlp == "swiglu" and variant_template(name).width == 1536
    with pytest.raises(CheckpointError, match="unknown variant"):  # timm's CLIP giant is 1408 wide, GELU
        variant_template("vit_giant_patch14_224")
