"""The Python API's export (export/api.py): ``vitdeploy.export(model, output_dir, config)`` as a notebook calls it:
``import vitdeploy`` alone loads neither torch nor ONNX Runtime; the model a path or a Hub name, the config a
mapping or a pipeline.yaml path; what comes back is the export with its typed manifest; the faults are the
package's typed errors."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import vitdeploy
from vitdeploy.base.errors import CheckpointError, ConfigError
from vitdeploy.export.api import export_model
from vitdeploy.runtime.manifest_schema import Manifest

#: model.onnx and model.ort.onnx only, one validation batch: the API's work, not the stages' (tested elsewhere)
FAST = {"export": {"fp16": {"enabled": False}, "int8": {"enabled": False}, "batch": {"min": 1, "opt": 1, "max": 2}}}


def test_import_vitdeploy_loads_neither_torch_nor_onnxruntime_until_the_api_runs():
    code = (
        "import sys, inspect, vitdeploy\n"
        "heavy = ('torch', 'onnxruntime', 'onnx', 'onnxscript')\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "assert callable(vitdeploy.export) and vitdeploy.Predictor.__name__ == 'Predictor'\n"
        "print(list(inspect.signature(vitdeploy.export).parameters)[:3])\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["[]", "['model', 'output_dir', 'config']", "[]"]


def test_vitdeploy_export_is_the_export_function_however_its_package_was_imported():
    import vitdeploy.export.onnx  # noqa: F401 - the subpackage is the attribute now: it must stay callable

    assert callable(vitdeploy.export)
    assert inspect.signature(vitdeploy.export) == inspect.signature(export_model)
    from vitdeploy import Predictor, export

    assert export is vitdeploy.export and Predictor is vitdeploy.Predictor
    with pytest.raises(AttributeError, match="no attribute 'exports'"):
        vitdeploy.exports  # noqa: B018


@pytest.mark.parametrize(
    "config, named",
    [
        ({"export": {"fp16": {"enabled": "sometimes"}}}, "export.fp16.enabled"),
        ({"exports": {}}, "exports"),
        (42, "got a int"),
        ("no/such/pipeline.yaml", "no/such/pipeline.yaml"),
    ],
    ids=["bad-value", "unknown-section", "not-a-config", "missing-file"],
)
def test_a_bad_config_is_a_config_error_naming_it_before_any_work(config, named, tmp_path):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        vitdeploy.export(None, tmp_path / "out", config)
    assert not (tmp_path / "out").exists()


def test_a_module_instead_of_a_checkpoint_is_a_config_error_saying_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="save_checkpoint"):
        vitdeploy.export(object(), tmp_path / "out", {})


def _written(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.integration
def test_export_with_a_mapping_returns_the_export_and_its_typed_manifest(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    result = vitdeploy.export(tiny_checkpoint, out, FAST, engine="skip")
    assert result.out_dir == out and set(result.artifacts) == {"onnx", "onnx-ort", "weights", "weights-config"}
    assert all(path.is_file() and path.parent == out for path in result.artifacts.values())
    manifest = result.manifest
    assert isinstance(manifest, Manifest)
    written = _written(out)
    assert {role: entry.sha256 for role, entry in manifest.artifacts.items()} == {
        role: entry["sha256"] for role, entry in written["artifacts"].items()
    }
    assert manifest.validation == written["validation"] and manifest.stages == written["stages"]
    assert manifest.validation["validate-onnx"]["passed"] and manifest.labels == tuple(f"c{i}" for i in range(7))


@pytest.mark.integration
def test_export_with_a_pipeline_yaml_reads_its_model_and_output_folder_relative_to_it(tiny_checkpoint, tmp_path):
    import shutil

    project = tmp_path / "project"
    shutil.copytree(tiny_checkpoint, project / "weights")
    (project / "pipeline.yaml").write_text(
        json.dumps({"model": {"checkpoint": "weights"}, "export": {**FAST["export"], "output_dir": "exported"}})
    )
    result = vitdeploy.export(config=str(project / "pipeline.yaml"), engine="skip")
    assert result.out_dir == project / "exported" and (project / "exported" / "manifest.json").is_file()
    assert result.manifest.model["source"]["path"] == str((project / "weights").resolve())


@pytest.mark.integration
def test_export_of_a_hub_name_pins_the_commit_it_exported(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers", reason="transformers writes the repo")
    import torch
    from helpers.fake_hub import FakeHub, folder_files, point_at

    transformers.logging.set_verbosity_error()
    vit = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    transformers.ViTForImageClassification(vit).save_pretrained(tmp_path / "repo")
    transformers.ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "repo")
    hub = FakeHub()
    try:
        commit = hub.add("acme/tiny-vit").commit(folder_files(tmp_path / "repo"))
        point_at(hub, monkeypatch, tmp_path / "hf")
        result = vitdeploy.export("acme/tiny-vit", tmp_path / "out", FAST, engine="skip")
    finally:
        hub.close()
    assert result.manifest.hub is not None and result.manifest.hub.commit == commit
    assert result.manifest.hub.repo_id == "acme/tiny-vit"


def test_a_model_that_names_nothing_is_a_config_error_naming_it(tmp_path):
    missing = tmp_path / "missing-folder"
    with pytest.raises(ConfigError, match="missing-folder.*no such file or directory.*not a Hugging Face Hub name"):
        vitdeploy.export(missing, tmp_path / "out", {})
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_folder_without_a_checkpoint_is_a_checkpoint_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError):
        vitdeploy.export(tmp_path / "empty", tmp_path / "out", FAST, engine="skip")
    assert not (tmp_path / "out" / "manifest.json").exists()
