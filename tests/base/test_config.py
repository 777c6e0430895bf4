"""pipeline.yaml: defaults, typed parsing, and one clear line + exit 2 for every mistake."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
from click.testing import CliRunner

from vitdeploy.base.config import load_config, parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.cli import main

REPO = Path(__file__).resolve().parents[2]


def check(tmp_path: Path, text: str):
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return CliRunner().invoke(main, ["config", "check", "-c", str(path)], catch_exceptions=False)


def test_empty_file_is_a_complete_pipeline_on_the_demo_model(tmp_path: Path):
    (tmp_path / "p.yaml").write_text("")
    cfg = load_config(tmp_path / "p.yaml")
    assert cfg.model.checkpoint is None
    assert (cfg.export.batch.min, cfg.export.batch.opt, cfg.export.batch.max) == (1, 8, 32)
    assert cfg.output_dir == tmp_path / "artifacts"  # relative to the YAML's folder, not the cwd


def test_only_a_checkpoint_is_a_complete_pipeline_and_paths_resolve_against_the_yaml(tmp_path: Path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "p.yaml").write_text("model: {checkpoint: ckpt}\n")
    cfg = load_config(tmp_path / "p.yaml")
    assert cfg.resolve(cfg.model.checkpoint) == tmp_path / "ckpt"


def test_shipped_pipeline_yaml_is_valid():
    cfg = load_config(REPO / "pipeline.yaml")
    assert cfg.runtime.backend == "auto" and cfg.export.opset >= 17


def test_config_objects_are_frozen():
    cfg = parse_config({})
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        cfg.export.batch.max = 64  # type: ignore[misc]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("model: {chekpoint: x}\n", ["unknown key 'model.chekpoint'", "checkpoint"]),
        ("exporter: {}\n", ["unknown key 'exporter'", "export"]),
        ("runtime: {threads: two}\n", ["'runtime.threads' = 'two'", "integer"]),
        ("export: {batch: {min: 8, opt: 4, max: 2}}\n", ["'export.batch'", "min <= opt <= max"]),
        (
            "validation: {fp16: {max_abs_diff: -1, mean_abs_diff: 0, min_cosine: 1, min_top1_agreement: 1, "
            "min_top5_overlap: 1}}\n",
            ["'validation.fp16.max_abs_diff' = -1"],
        ),
        (
            "model: {checkpoint: missing/vit.safetensors}\n",
            ["'model.checkpoint' = 'missing/vit.safetensors'", "no such file"],
        ),
        ("runtime: {device: gpu0}\n", ["'runtime.device' = 'gpu0'"]),
        ("serve: {max_batch_size: 0}\n", ["'serve.max_batch_size' = 0"]),
        ("serve: {max_batch_size: 32, max_ongoing_requests: 8}\n", ["'serve'", "max_ongoing_requests (8)"]),
        ("serve: {port: 70000}\n", ["'serve.port' = 70000"]),
        ("serve: {tracing: {sampling_ratio: 1.5}}\n", ["'serve.tracing.sampling_ratio' = 1.5"]),
        ("serve: {batch_wait: 1}\n", ["unknown key 'serve.batch_wait'", "batch_wait_timeout_s"]),
        ("preprocess: {std: [0.5, 0, 0.5]}\n", ["'preprocess.std[1]' = 0", "greater than 0"]),
        ("preprocess: {background: [300, 0, 0]}\n", ["'preprocess.background[0]' = 300"]),
        ("model: [1, 2\n", ["invalid YAML", "line"]),
        ("- just\n- a list\n", ["top level must be a mapping"]),
    ],
)
def test_bad_config_is_one_clear_line_and_exit_2(tmp_path: Path, text: str, expected: list[str]):
    res = check(tmp_path, text)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "pipeline.yaml" in lines[0]
    for fragment in expected:
        assert fragment in lines[0]
    assert "Traceback" not in res.output


def test_missing_config_file_is_exit_2(tmp_path: Path):
    res = CliRunner().invoke(main, ["config", "check", "-c", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "config file not found" in res.stderr


def test_good_config_check_prints_the_effective_configuration(tmp_path: Path):
    res = check(tmp_path, "runtime: {top_k: 3}\n")
    assert res.exit_code == 0 and '"top_k": 3' in res.stdout


def test_parse_config_rejects_unknown_keys_in_python_too():
    with pytest.raises(ConfigError, match="unknown key 'tensorrt.workspace'"):
        parse_config({"tensorrt": {"workspace": 1}})


def test_config_check_shows_the_effective_preprocessing_with_origins(tmp_path: Path):
    import json

    result = check(tmp_path, "preprocess:\n  style: timm\n  crop_pct: 0.9\n")
    assert result.exit_code == 0, result.output
    dump = json.loads(result.output[result.output.index("{") : result.output.rindex("}") + 1])
    # the configured checkpoint's values, not nulls: the demo model's own preprocessing with the two overrides
    assert dump["preprocess"]["style"] == "timm" and dump["preprocess"]["crop_pct"] == 0.9
    assert None not in dump["preprocess"].values()
    assert dump["preprocess"]["height"] == 32 and dump["preprocess"]["interpolation"] == "bilinear"
    origins = dump["preprocess_origins"]
    assert (
        origins["crop_pct"] == "pipeline.yaml: preprocess.crop_pct"
        and origins["style"] == "pipeline.yaml: preprocess.style"
    )
    assert origins["mean"] == "checkpoint: model.json" and origins["crop_mode"].startswith("library default")
    assert "model: vitdeploy checkpoint from the built-in demo model" in result.output
    assert "width 64, depth 4, 4 heads" in result.output


def test_model_keys_for_what_a_bare_state_dict_cannot_say(tmp_path: Path):
    cfg = parse_config({"model": {"num_heads": 6, "activation": "gelu_tanh", "layer_norm_eps": 1e-5}}, None)
    assert (cfg.model.num_heads, cfg.model.activation, cfg.model.layer_norm_eps) == (6, "gelu_tanh", 1e-5)
    with pytest.raises(ConfigError, match="model.activation"):
        parse_config({"model": {"activation": "relu"}}, None)
    with pytest.raises(ConfigError, match="model.num_heads"):
        parse_config({"model": {"num_heads": 0}}, None)
