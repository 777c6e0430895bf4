"""The model room's single definitions (issue 20): checkpoint formats as registered readers, one ViT
config class for the network and model.json, one preprocessing recipe for Python, manifest.json and
pipeline.yaml."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import torch

from vitdeploy.base.config import PreprocessSection, parse_config
from vitdeploy.base.errors import ArtifactError, CheckpointError, ConfigError
from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.base.vit_schema import HEADS_BY_WIDTH, SIZE_BY_WIDTH, VARIANTS, parse_vit_config
from vitdeploy.model import VisionTransformer, ViTConfig, load_checkpoint
from vitdeploy.model.formats import FORMATS, READERS, Reader, reader_for
from vitdeploy.model.formats.timm import TimmReader
from vitdeploy.runtime.manifest_schema import parse_manifest

safetensors_torch = pytest.importorskip("safetensors.torch")

TINY = dict(image_size=32, patch_size=8, width=32, depth=2, heads=2, num_classes=3)


def _timm_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = VisionTransformer(ViTConfig(**TINY)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return {k: v.contiguous() for k, v in model.state_dict().items()}


class _PrefixedReader(Reader):
    """A made-up format: a timm state dict with every key under ``custom.``."""

    format = "custom"

    def claims_keys(self, keys: set[str], where: Path) -> bool:
        return "custom.patch_embed.proj.weight" in keys

    def convert_keys(self, state):
        return {k.removeprefix("custom."): v for k, v in state.items()}

    def config(self, src, state, opts):
        return TimmReader().config(src, state, opts)


def test_a_registered_reader_is_all_a_new_format_needs(tmp_path, monkeypatch):
    state = _timm_state()
    safetensors_torch.save_file(state, str(tmp_path / "timm.safetensors"))
    safetensors_torch.save_file({f"custom.{k}": v for k, v in state.items()}, str(tmp_path / "custom.safetensors"))
    with pytest.raises(CheckpointError, match="unknown checkpoint format"):
        load_checkpoint(tmp_path / "custom.safetensors", num_heads=2)

    monkeypatch.setitem(READERS, "custom", _PrefixedReader())  # the one registry line
    custom = load_checkpoint(tmp_path / "custom.safetensors", num_heads=2)
    timm = load_checkpoint(tmp_path / "timm.safetensors", num_heads=2)
    assert custom.source_format == "custom" and timm.source_format == "timm"
    assert custom.config == timm.config and custom.preprocess is None  # the default: nothing stated
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(custom.model(x), timm.model(x), rtol=0, atol=0)


def test_every_format_has_its_reader():
    assert FORMATS == ("vitdeploy", "hf", "timm", "open_clip", "torchvision")
    assert all(reader_for(f).format == f for f in FORMATS)
    with pytest.raises(CheckpointError, match="unsupported checkpoint format 'onnx'; supported: vitdeploy, hf"):
        reader_for("onnx")


def test_model_json_vit_is_read_into_the_network_config_itself():
    cfg = parse_vit_config({**TINY, "pool": "avg"}, "model.json", key_prefix="vit")
    assert type(cfg) is ViTConfig and cfg == ViTConfig(**TINY, pool="avg") and cfg.grid == 4
    with pytest.raises(CheckpointError, match=r"model.json: unknown key 'vit.colour'"):
        parse_vit_config({**TINY, "colour": "red"}, "model.json", key_prefix="vit", error=CheckpointError)
    with pytest.raises(CheckpointError, match=r"'vit.width' = '32'"):  # strict in a file, as before
        parse_vit_config({**TINY, "width": "32"}, "model.json", key_prefix="vit", error=CheckpointError)
    with pytest.raises(CheckpointError, match="pos_embed 'sincos' needs width divisible by 4"):
        parse_vit_config({**TINY, "width": 34, "heads": 2, "pos_embed": "sincos"}, "model.json", error=CheckpointError)


def test_standard_sizes_agree_with_the_variants():
    for name, cfg in VARIANTS.items():
        assert HEADS_BY_WIDTH[cfg.width] == cfg.heads and name.startswith(f"vit_{SIZE_BY_WIDTH[cfg.width]}_")


def test_pipeline_preprocess_keys_are_the_spec_fields_but_the_size():
    spec_fields = [f.name for f in fields(PreprocessSpec) if f.name not in ("height", "width")]
    assert list(PreprocessSection.model_fields) == spec_fields
    assert all(PreprocessSection.model_fields[k].description for k in spec_fields)
    cfg = parse_config({"preprocess": {"crop_pct": 0.9}})
    assert cfg.preprocess.crop_pct == 0.9 and cfg.preprocess.style is None  # None keeps the checkpoint's
    with pytest.raises(ConfigError, match=r"'preprocess.shortest_edge' = 0"):
        parse_config({"preprocess": {"shortest_edge": 0}})


def _manifest(preprocess: dict) -> dict:
    return {
        "format": "vitdeploy-manifest",
        "version": 1,
        "labels": ["a", "b"],
        "preprocess": {"height": 32, "width": 32, **preprocess},
        "io": {
            "input": {"name": "pixel_values", "shape": ["batch", 3, 32, 32]},
            "output": {"name": "logits", "shape": ["batch", 2]},
        },
        "artifacts": {"onnx": {"path": "model.onnx", "sha256": "0" * 64, "bytes": 1}},
    }


def test_manifest_preprocess_is_the_spec_checked_as_in_python():
    manifest = parse_manifest(_manifest({"style": "timm", "crop_pct": 1.0}), Path("m.json"))
    assert manifest.preprocess == PreprocessSpec(style="timm", height=32, width=32, crop_pct=1.0)
    with pytest.raises(ArtifactError, match=r"m.json: 'preprocess' = .*style 'torchvision' needs shortest_edge"):
        parse_manifest(_manifest({"style": "torchvision"}), Path("m.json"))
    with pytest.raises(ArtifactError, match=r"'preprocess.background\[0\]' = 1.0"):  # no silent rounding
        parse_manifest(_manifest({"background": [1.0, 2, 3]}), Path("m.json"))
    with pytest.raises(ArtifactError, match=r"unknown key 'preprocess.gamma'"):
        parse_manifest(_manifest({"gamma": 2.2}), Path("m.json"))


def test_the_former_formats_module_names_still_resolve_with_a_warning():
    import vitdeploy.model.formats as formats
    from vitdeploy.model.formats import shared

    with pytest.warns(DeprecationWarning, match="moved to vitdeploy.model.formats.shared.read_state_dict"):
        assert formats.read_state_dict is shared.read_state_dict
    with pytest.raises(AttributeError):
        formats.no_such_helper  # noqa: B018 - the attribute lookup is the test
