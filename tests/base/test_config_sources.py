"""config_from: the pipeline config from what a Python caller holds (vitdeploy.export, Predictor.open): a mapping
of sections, a pipeline.yaml path, a PipelineConfig, or None (./pipeline.yaml where it exists, as the CLI
without -c), each validated as a pipeline.yaml is."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from vitdeploy.base.config import PipelineConfig, config_from, parse_config
from vitdeploy.base.errors import ConfigError


def test_a_mapping_is_validated_as_a_file_and_its_relative_paths_are_the_current_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config_from(MappingProxyType({"export": {"output_dir": "out"}, "runtime": {"top_k": 3}}))
    assert cfg.output_dir == tmp_path / "out" and cfg.runtime.top_k == 3
    with pytest.raises(ConfigError, match=r"runtime\.top_k"):
        config_from({"runtime": {"top_k": 0}})


def test_a_path_is_read_with_its_relative_paths_against_its_folder(tmp_path):
    (tmp_path / "project").mkdir()
    path = tmp_path / "project" / "pipeline.yaml"
    path.write_text(json.dumps({"export": {"output_dir": "exported"}}))
    for source in (path, str(path)):
        assert config_from(source).output_dir == tmp_path / "project" / "exported"
    with pytest.raises(ConfigError, match="config file not found"):
        config_from(tmp_path / "missing.yaml")


def test_none_reads_the_current_folders_pipeline_yaml_and_an_empty_mapping_is_the_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config_from(None).runtime.top_k == PipelineConfig().runtime.top_k
    (tmp_path / "pipeline.yaml").write_text("runtime: {top_k: 2}\n")
    assert config_from(None).runtime.top_k == 2
    assert config_from({}).runtime.top_k == PipelineConfig().runtime.top_k


def test_a_config_is_itself_and_anything_else_is_refused():
    cfg = parse_config({"runtime": {"top_k": 4}}, None)
    assert config_from(cfg) is cfg
    with pytest.raises(ConfigError, match="got a list"):
        config_from([("runtime", {})])
