"""An export never says "ok" for a manifest its own runtime refuses (issue 37): every kind of checkpoint the
readers accept, with and without a classification head, in each format, exports into a folder that
`vitdeploy predict` opens and answers from (labels and top-k for a classifier, vectors for a backbone);
a manifest the runtime would refuse fails the export; an embedding export is predicted and validated as
vectors on the command line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import save_file

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError, ExportError
from vitdeploy.cli import main
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.export.pipeline import run_export
from vitdeploy.model.checkpoints import save_checkpoint
from vitdeploy.model.vit import VisionTransformer, ViTConfig
from vitdeploy.runtime.predictor import Embedding, Prediction, Predictor

transformers = pytest.importorskip("transformers")

TINY = dict(image_size=32, patch_size=8, width=32, depth=1, heads=2)
FAST = {
    "fp16": {"enabled": False},
    "int8": {"enabled": False},
    "optimize": False,
    "batch": {"min": 1, "opt": 2, "max": 4},
}
IMAGES = sorted(IMAGES_DIR.glob("*.png"))[:3]


def _vit(classes: int, seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(ViTConfig(**TINY, num_classes=classes)).eval()


def _vitdeploy(folder: Path, head: bool) -> tuple[Path, dict]:
    model = _vit(3 if head else 0)
    save_checkpoint(folder, model, ["a", "b", "c"] if head else [], None, "tiny")
    return folder, {}


def _timm(folder: Path, head: bool) -> tuple[Path, dict]:
    folder.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in _vit(3 if head else 0).state_dict().items()}  # timm's own key names
    save_file(state, str(folder / "model.safetensors"))
    return folder / "model.safetensors", {"num_heads": 2}


def _torchvision(folder: Path, head: bool) -> tuple[Path, dict]:
    """torchvision's naming; a headless one as torchvision users make it (``model.heads = nn.Identity()``)."""
    folder.mkdir(parents=True)
    ours = _vit(3 if head else 0).state_dict()
    tv = {
        "class_token": ours["cls_token"],
        "conv_proj.weight": ours["patch_embed.proj.weight"],
        "conv_proj.bias": ours["patch_embed.proj.bias"],
        "encoder.pos_embedding": ours["pos_embed"],
        "encoder.ln.weight": ours["norm.weight"],
        "encoder.ln.bias": ours["norm.bias"],
    }
    layer, block = "encoder.layers.encoder_layer_0.", "blocks.0."
    for theirs, mine in (
        ("ln_1", "norm1"),
        ("self_attention.out_proj", "attn.proj"),
        ("ln_2", "norm2"),
        ("mlp.0", "mlp.fc1"),
        ("mlp.3", "mlp.fc2"),
    ):
        for p in ("weight", "bias"):
            tv[f"{layer}{theirs}.{p}"] = ours[f"{block}{mine}.{p}"]
    tv[layer + "self_attention.in_proj_weight"] = ours[block + "attn.qkv.weight"]
    tv[layer + "self_attention.in_proj_bias"] = ours[block + "attn.qkv.bias"]
    if head:
        tv["heads.head.weight"], tv["heads.head.bias"] = ours["head.weight"], ours["head.bias"]
    torch.save(tv, folder / "vit.pth")
    return folder / "vit.pth", {"num_heads": 2}


def _hf(folder: Path, head: bool) -> tuple[Path, dict]:
    cfg = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128, image_size=32, patch_size=8
    )
    if head:
        cfg.id2label, cfg.label2id = {0: "a", 1: "b", 2: "c"}, {"a": 0, "b": 1, "c": 2}
        model = transformers.ViTForImageClassification(cfg)
    else:
        model = transformers.ViTModel(cfg)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder, {}


FORMATS = {"vitdeploy": _vitdeploy, "timm": _timm, "torchvision": _torchvision, "hf": _hf}


def _config(checkpoint: Path, model: dict | None = None, **export) -> dict:
    return {
        "model": {"checkpoint": str(checkpoint), **(model or {})},
        "validation": {"noise_samples": 4, "max_images": 8},
        "export": {**FAST, **export},
    }


@pytest.mark.parametrize("head", [True, False], ids=["classifier", "backbone"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_with_and_without_a_head_exports_what_predict_opens(fmt, head, tmp_path):
    checkpoint, model = FORMATS[fmt](tmp_path / "ckpt", head)
    result = run_export(parse_config(_config(checkpoint, model), None), tmp_path / "art", engine="skip")
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["output"]["kind"] == ("logits" if head else "embedding")
    for backend in ("ort", "torch"):
        with Predictor.from_artifacts(tmp_path / "art", backend=backend) as predictor:
            answers, labels = predictor.predict(IMAGES), predictor.labels
        assert len(answers) == len(IMAGES)
        if head:
            assert len(labels) == 3 and all(isinstance(a, Prediction) and a.label in labels for a in answers)
        else:
            assert all(isinstance(a, Embedding) and len(a.vector) == 32 for a in answers)


def test_logits_from_a_backbone_is_refused_naming_the_key(tmp_path):
    checkpoint, model = _vitdeploy(tmp_path / "ckpt", head=False)
    with pytest.raises(ConfigError, match=r"model.output is logits .* has no classification head"):
        run_export(parse_config(_config(checkpoint, {**model, "output": "logits"}), None), tmp_path / "art")
    assert not (tmp_path / "art" / "manifest.json").exists()


def test_a_manifest_the_runtime_would_refuse_fails_the_export(tmp_path, monkeypatch):
    """The guard itself: a manifest written wrong (here: a classifier's labels dropped) is read back through
    the runtime's schema and the export fails naming the refusal, instead of printing `next: predict`."""
    from vitdeploy.export import manifest as manifest_mod

    real = manifest_mod.build_manifest
    monkeypatch.setattr(manifest_mod, "build_manifest", lambda **kw: {**real(**kw), "labels": []})
    checkpoint, model = _vitdeploy(tmp_path / "ckpt", head=True)
    with pytest.raises(ExportError, match=r"the export's own runtime refuses what it wrote .*labels has 0 entries"):
        run_export(parse_config(_config(checkpoint, model), None), tmp_path / "art", engine="skip")
    assert not (tmp_path / "art" / "manifest.json").exists()  # the staging folder was never swapped in


def test_predict_and_validate_of_an_embedding_export_on_the_command_line(tmp_path):
    """`predict --json` gives each image's vector (normalised: unit length), the table its first values;
    `validate` judges each backend by cosine and recall@k with no top-1, flips or accuracy."""
    checkpoint, _ = _hf(tmp_path / "ckpt", head=False)
    config = tmp_path / "pipeline.yaml"
    data = _config(checkpoint, {"normalize": True}, optimize=True)
    data["export"]["output_dir"] = str(tmp_path / "art")
    config.write_text(yaml.safe_dump(data))
    cli = CliRunner()
    res = cli.invoke(main, ["export", "-c", str(config), "--engine", "skip"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    res = cli.invoke(
        main, ["predict", *map(str, IMAGES), "-a", str(tmp_path / "art"), "--json"], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(records) == 3 and all(set(r) == {"path", "embedding"} for r in records)
    assert all(abs(sum(v * v for v in r["embedding"]) - 1.0) < 1e-5 for r in records)
    res = cli.invoke(main, ["predict", str(IMAGES[0]), "-a", str(tmp_path / "art")], catch_exceptions=False)
    assert "32 values" in res.stdout and "top-" not in res.stdout
    res = cli.invoke(main, ["validate", "-a", str(tmp_path / "art"), "-c", str(config)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "recall@10" in res.stdout and "top1" not in res.stdout and "flipped" not in res.stdout
    drift = json.loads((tmp_path / "art" / "drift-report.json").read_text())
    ort = next(b for b in drift["backends"] if b["name"] == "ort")
    assert ort["metrics"]["recall_at_k"] == 1.0 and ort["flipped"] == [] and ort["accuracy"] is None
