"""Hugging Face ViT checkpoints load into vitdeploy's ViT with the same logits as transformers itself.

transformers is a test-only dependency; models are built locally with random weights (no hub access).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from vitdeploy.base.errors import CheckpointError
from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.model import detect_format, load_checkpoint

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-4
LABELS = [f"label_{c}" for c in "abcdefghij"]


def _hf_config(**overrides):
    kwargs = dict(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
        id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)},
    )
    kwargs.update(overrides)
    return transformers.ViTConfig(**kwargs)


@torch.no_grad()
def _randomize(model, seed: int = 0, std: float = 0.1):
    """Replace HF's std-0.02 init by larger random weights (std 0.1) so that attention is far from
    uniform and a mixed-up q/k/v or head split shows in the logits."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if "layernorm" in name and name.endswith("weight"):
            param.copy_(1.0 + std * noise)
        elif "cls_token" in name or "position_embeddings" in name:
            param.copy_(5 * std * noise)
        else:
            param.copy_(std * noise)
    return model.eval()


def _hf_classifier(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return _randomize(transformers.ViTForImageClassification(_hf_config(**overrides)), seed)


def _images(n: int = 3, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(11))


@torch.no_grad()
def _diff(ck, hf_model, x, **hf_kwargs) -> float:
    ours = ck.model(x)
    theirs = hf_model(pixel_values=x, **hf_kwargs).logits
    assert ours.shape == theirs.shape
    return float((ours - theirs).abs().max())


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def test_save_pretrained_safetensors_same_logits(tmp_path):
    model = _hf_classifier()
    model.save_pretrained(tmp_path)
    processor = transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, resample=3, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]
    )
    processor.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()

    ck = load_checkpoint(tmp_path)
    assert ck.source_format == "hf" and detect_format(tmp_path) == "hf" and ck.name == tmp_path.name
    assert ck.labels == tuple(LABELS)
    cfg = ck.config
    assert (cfg.width, cfg.depth, cfg.heads, cfg.mlp_dim, cfg.image_size, cfg.patch_size, cfg.num_classes) == (
        64,
        2,
        4,
        128,
        32,
        8,
        10,
    )
    assert cfg.layer_norm_eps == 1e-12
    assert ck.preprocess == PreprocessSpec(
        style="hf", height=32, width=32, interpolation="bicubic", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
    )
    x = _images()
    assert _diff(ck, model, x) <= TOL
    # the weights file inside the directory is recognised through its config.json too
    assert detect_format(tmp_path / "model.safetensors") == "hf"
    assert _diff(load_checkpoint(tmp_path / "model.safetensors"), model, x) <= TOL


def test_sensitivity_guard_swapped_query_key_changes_logits(tmp_path):
    """Guard: with these weights, a loader that swapped q and k would be caught by TOL."""
    model = _hf_classifier()
    model.save_pretrained(tmp_path)
    state = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    for i in range(2):
        p = f"vit.encoder.layer.{i}.attention.attention."
        for part in ("weight", "bias"):
            state[p + f"query.{part}"], state[p + f"key.{part}"] = state[p + f"key.{part}"], state[p + f"query.{part}"]
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    assert _diff(load_checkpoint(tmp_path), model, _images()) > 100 * TOL


def test_pytorch_model_bin_same_logits(tmp_path):
    model = _hf_classifier(seed=1)
    model.save_pretrained(tmp_path, safe_serialization=False)
    if not (tmp_path / "pytorch_model.bin").is_file():
        # transformers 5 always writes safetensors: write the .bin the way older versions did
        state = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
        torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink(missing_ok=True)
    ck = load_checkpoint(tmp_path)
    assert ck.source_format == "hf" and ck.labels == tuple(LABELS)
    # no preprocessor_config.json: transformers' ViTImageProcessor defaults, said to be an assumption
    assert ck.preprocess == PreprocessSpec(style="hf", height=32, width=32, interpolation="bilinear")
    assert any("no preprocessor_config.json" in n and "preprocess:" in n for n in ck.notes)
    assert _diff(ck, model, _images()) <= TOL


def test_both_key_namings_same_logits(tmp_path):
    """transformers 5 writes the hub naming (encoder.layer.N.attention.attention.query ...) to disk but
    names its modules differently in memory (layers.N.attention.q_proj ...); both load."""
    model = _hf_classifier(seed=2)
    model.save_pretrained(tmp_path / "disk")
    disk_keys = set(safetensors_torch.load_file(str(tmp_path / "disk" / "model.safetensors")))
    memory = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert disk_keys != set(memory), "transformers now writes its in-memory naming; this test needs the other one"
    hub_style = {
        "vit.encoder.layer.0.attention.attention.query.weight",
        "vit.encoder.layer.0.intermediate.dense.weight",
    }
    assert hub_style <= disk_keys  # save_pretrained writes the hub naming
    assert hub_style.isdisjoint(set(memory))  # ... while the modules in memory are named differently

    other = tmp_path / "memory"
    other.mkdir()
    (other / "config.json").write_text((tmp_path / "disk" / "config.json").read_text())
    safetensors_torch.save_file(memory, str(other / "model.safetensors"))
    x = _images()
    assert _diff(load_checkpoint(tmp_path / "disk"), model, x) <= TOL
    assert _diff(load_checkpoint(other), model, x) <= TOL


def test_hub_legacy_naming_written_by_hand_same_logits(tmp_path):
    """The hub naming built from the in-memory modules by hand, independent of save_pretrained."""
    model = _hf_classifier(seed=3)
    names = {
        "attention.q_proj": "attention.attention.query",
        "attention.k_proj": "attention.attention.key",
        "attention.v_proj": "attention.attention.value",
        "attention.o_proj": "attention.output.dense",
        "mlp.fc1": "intermediate.dense",
        "mlp.fc2": "output.dense",
    }
    legacy = {}
    for key, value in model.state_dict().items():
        new = key.replace("vit.layers.", "vit.encoder.layer.")
        for a, b in names.items():
            new = new.replace(f".{a}.", f".{b}.")
        legacy[new] = value.contiguous()
    assert "vit.encoder.layer.1.attention.attention.value.bias" in legacy
    model.config.save_pretrained(tmp_path)
    safetensors_torch.save_file(legacy, str(tmp_path / "model.safetensors"))
    assert _diff(load_checkpoint(tmp_path), model, _images()) <= TOL


def test_vit_model_without_head_gives_features(tmp_path):
    torch.manual_seed(4)
    base = _randomize(transformers.ViTModel(_hf_config(num_labels=2, id2label=None, label2id=None)), 4)
    base.save_pretrained(tmp_path)
    keys = set(safetensors_torch.load_file(str(tmp_path / "model.safetensors")))
    assert any(k.startswith("pooler.") for k in keys)  # present, and read: the backbone's pooler_output
    ck = load_checkpoint(tmp_path)
    assert ck.config.num_classes == 0 and ck.labels == () and ck.config.pooler
    x = _images()
    with torch.no_grad():
        theirs = base(pixel_values=x).pooler_output
        assert float((ck.model(x) - theirs).abs().max()) <= TOL


def test_no_qkv_bias_and_other_eps_same_logits(tmp_path):
    model = _hf_classifier(seed=5, qkv_bias=False, layer_norm_eps=1e-6, num_channels=1)
    model.save_pretrained(tmp_path)
    ck = load_checkpoint(tmp_path)
    assert not ck.config.qkv_bias and ck.config.layer_norm_eps == 1e-6 and ck.config.in_channels == 1
    assert _diff(ck, model, torch.randn(2, 1, 32, 32)) <= TOL


def test_resampled_position_embeddings_at_new_image_size(tmp_path):
    """Loading at 48 px resamples the 4x4 position table to 6x6 with resample_pos_embed (timm's
    antialiased bicubic, which is not HF's interpolate_pos_encoding); an HF model built for 48 px with
    that same table gives the same logits, so nothing else changes."""
    from vitdeploy.model import resample_pos_embed

    model = _hf_classifier(seed=6)
    model.save_pretrained(tmp_path)
    ck = load_checkpoint(tmp_path, image_size=48)
    assert ck.config.image_size == 48 and ck.model.pos_embed.shape == (1, 37, 64)
    big = transformers.ViTForImageClassification(_hf_config(image_size=48)).eval()
    state = dict(model.state_dict())
    state["vit.embeddings.position_embeddings"] = resample_pos_embed(state["vit.embeddings.position_embeddings"], 6)
    big.load_state_dict(state, strict=True)
    assert _diff(ck, big, _images(2, size=48)) <= TOL
    same = load_checkpoint(tmp_path, image_size=32)
    assert torch.equal(same.model.pos_embed, model.vit.embeddings.position_embeddings)


def test_sharded_checkpoint_same_logits(tmp_path):
    model = _hf_classifier(seed=7)
    model.save_pretrained(tmp_path / "one")
    state = safetensors_torch.load_file(str(tmp_path / "one" / "model.safetensors"))
    (tmp_path / "one" / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in shards.items():
        safetensors_torch.save_file({k: state[k] for k in part}, str(tmp_path / "one" / name))
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (tmp_path / "one" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _diff(load_checkpoint(tmp_path / "one"), model, _images()) <= TOL


def test_variant_must_agree_with_hf_config(tmp_path):
    _hf_classifier().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"does not match variant 'vit_base_patch16_224'.*width 64"):
        load_checkpoint(tmp_path, variant="vit_base_patch16_224")


def test_incomplete_hf_checkpoint_lists_keys(tmp_path):
    model = _hf_classifier()
    model.save_pretrained(tmp_path)
    state = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    del state["vit.encoder.layer.1.attention.attention.value.weight"]
    state["vit.encoder.layer.0.attention.attention.extra.weight"] = torch.zeros(3)
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    msg = str(err.value)
    assert "missing keys (1, vitdeploy naming): blocks.1.attn.qkv.weight" in msg
    assert "vit.encoder.layer.0.attention.attention.extra.weight" in msg
    assert "vit.encoder.layer.1.attention.attention.query.weight" in msg  # the unpaired q/k pieces


def test_id2label_must_cover_the_classifier(tmp_path):
    model = _hf_classifier()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "only"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="id2label has 1 entries .* classifier has 10 outputs"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("hidden_act", ["gelu_pytorch_tanh", "gelu_new"])
def test_tanh_gelu_same_logits(tmp_path, hidden_act):
    model = _hf_classifier(hidden_act=hidden_act)
    model.save_pretrained(tmp_path)
    ck = load_checkpoint(tmp_path)
    assert ck.config.act == "gelu_tanh"
    tanh_diff = _diff(ck, model, _images())
    assert tanh_diff <= TOL
    exact = load_checkpoint(tmp_path).model
    for block in exact.blocks:
        block.mlp.approximate = "none"  # the erf GELU would not match: the test can tell them apart
    with torch.no_grad():
        erf_diff = float((exact(_images()) - model(pixel_values=_images()).logits).abs().max())
    assert erf_diff > 3 * TOL and tanh_diff < erf_diff / 20


def test_other_activation_is_refused(tmp_path):
    model = _hf_classifier(hidden_act="silu")
    model.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"hidden_act 'silu' is not supported"):
        load_checkpoint(tmp_path)


@pytest.mark.slow
def test_vit_b16_sized_same_logits(tmp_path):
    """ViT-B/16 at 224 (86M random weights): same logits as transformers."""
    config = transformers.ViTConfig(num_labels=1000)  # HF defaults are ViT-B/16 at 224
    with torch.device("meta"):  # skip HF's slow init: every weight is filled below
        model = transformers.ViTForImageClassification(config)
    model = _randomize(model.to_empty(device="cpu"), seed=0, std=0.02)
    model.save_pretrained(tmp_path)
    ck = load_checkpoint(tmp_path)
    cfg = ck.config
    assert (cfg.width, cfg.depth, cfg.heads, cfg.mlp_dim, cfg.image_size, cfg.patch_size, cfg.num_classes) == (
        768,
        12,
        12,
        3072,
        224,
        16,
        1000,
    )
    assert ck.labels[:2] == ("LABEL_0", "LABEL_1")
    assert _diff(ck, model, torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))) <= TOL


@pytest.mark.parametrize("cls_name, registers", [("Dinov2ForImageClassification", 0), ("Dinov2WithRegistersModel", 2)])
def test_dinov2_swiglu_both_namings_same_logits(tmp_path, cls_name, registers):
    """use_swiglu_ffn=True (DINOv2 giant's MLP): save_pretrained writes the hub's packed mlp.weights_in /
    weights_out, the modules in memory are gate_proj / up_proj / down_proj; both load with transformers' output,
    at DINOv2's hidden width (two thirds of hidden_size * mlp_ratio, rounded up to a multiple of 8)."""
    config_cls = transformers.Dinov2WithRegistersConfig if registers else transformers.Dinov2Config
    extra = {"num_register_tokens": registers} if registers else {"num_labels": 10}
    config = config_cls(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        use_swiglu_ffn=True, layerscale_value=0.5, **extra,
    )  # fmt: skip
    torch.manual_seed(4)
    model = _randomize(getattr(transformers, cls_name)(config), seed=4)
    model.save_pretrained(tmp_path / "disk")
    disk_keys = set(safetensors_torch.load_file(str(tmp_path / "disk" / "model.safetensors")))
    memory = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("layer.0.mlp.weights_in.weight") for k in disk_keys)
    assert any(k.endswith(".0.mlp.gate_proj.weight") for k in memory)
    other = tmp_path / "memory"
    other.mkdir()
    (other / "config.json").write_text((tmp_path / "disk" / "config.json").read_text())
    safetensors_torch.save_file(memory, str(other / "model.safetensors"))
    x = _images()
    for folder in (tmp_path / "disk", other):
        ck = load_checkpoint(folder)
        assert (ck.config.mlp, ck.config.mlp_dim, ck.config.fc1_dim) == ("swiglu", 176, 352)  # int(256 * 2/3) = 170
        with torch.no_grad():
            theirs = model(pixel_values=x)
            theirs = theirs.logits if registers == 0 else theirs.pooler_output
            assert float((ck.model(x) - theirs).abs().max()) <= TOL
