"""`vitdeploy triton-repo --new-version`: a second export of the same model as the next version folder of every
model, the live version untouched, the ensemble calling the new one; what cannot be a version of the same model
refused in one line with nothing written. (The switch on a running tritonserver: test_triton_server.py.)"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.runtime.artifacts import sha256_file

pb = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="tritonclient not installed (pip install 'tritonclient[grpc]')"
)
from google.protobuf import text_format  # noqa: E402  (protobuf comes with tritonclient[grpc])

NAME = "tiny"
STEPS = [f"{NAME}_preprocess", f"{NAME}_ort_python", f"{NAME}_postprocess"]


def run(*args: str):
    return CliRunner().invoke(main, ["triton-repo", *args, "--inference", "ort_python"], catch_exceptions=False)


def tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def config(repo: Path, model: str) -> "pb.ModelConfig":
    return text_format.Parse((repo / model / "config.pbtxt").read_text(), pb.ModelConfig())


@pytest.fixture()
def repo(tiny_artifacts, tmp_path: Path) -> Path:
    out = tmp_path / "repo"
    assert run("-a", str(tiny_artifacts(seed=0)), "-o", str(out)).exit_code == 0
    return out


def _edited(export: Path, where: Path, edit) -> Path:
    """A copy of ``export`` whose manifest ``edit`` changed."""
    shutil.copytree(export, where)
    manifest = json.loads((where / "manifest.json").read_text())
    edit(manifest)
    (where / "manifest.json").write_text(json.dumps(manifest))
    return where


def test_the_new_export_is_version_2_of_every_model_and_the_ensemble_calls_it(repo: Path, tiny_artifacts):
    first = {m.name: tree(m / "1") for m in repo.iterdir() if (m / "1").is_dir()}
    configs_before = {m: (repo / m / "config.pbtxt").read_text() for m in first}
    new = tiny_artifacts(seed=1)
    result = run("-a", str(new), "-o", str(repo), "--new-version")
    assert result.exit_code == 0, result.output
    assert "added version 2" in result.output
    assert set(first) == {NAME, f"{NAME}_onnx", *STEPS}
    for model, files in first.items():
        assert tree(repo / model / "1") == files, f"{model}/1 changed"  # the live version as it was
        assert (repo / model / "2").is_dir()
        if model != NAME:  # a version shares its model's config: the steps' is unchanged, all versions load
            assert (repo / model / "config.pbtxt").read_text() == configs_before[model]
            assert config(repo, model).version_policy.WhichOneof("policy_choice") == "all"
    assert tree(repo / f"{NAME}_ort_python" / "2" / "artifacts")["model.onnx"] == sha256_file(new / "model.onnx")
    ensemble = config(repo, NAME)
    assert [(s.model_name, s.model_version) for s in ensemble.ensemble_scheduling.step] == [(m, 2) for m in STEPS]
    assert ensemble.parameters["vitdeploy_export_sha256"].string_value == sha256_file(new / "manifest.json")
    readme = (repo / "README.md").read_text()
    assert "switch a running server from 1 to 2" in readme and f"rm -r {STEPS[0]}/1" in readme
    # and once more: version 3 (the first export again: going back is going forward)
    assert run("-a", str(tiny_artifacts(seed=0)), "-o", str(repo), "--new-version").exit_code == 0
    assert {s.model_version for s in config(repo, NAME).ensemble_scheduling.step} == {3}
    assert "from 2 to 3" in (repo / "README.md").read_text()


def _refused(repo: Path, export: Path, *more: str) -> str:
    before = tree(repo)
    result = run("-a", str(export), "-o", str(repo), "--new-version", *more)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert tree(repo) == before and not any(repo.glob("*/2")), "nothing written"
    assert not [p for p in repo.parent.iterdir() if p.name.startswith(f".{repo.name}.")], "no staging left"
    return result.output


def test_what_cannot_be_a_version_of_the_same_model_is_refused_in_one_line(repo: Path, tiny_artifacts, tmp_path):
    new = tiny_artifacts(seed=1)
    renamed = _edited(new, tmp_path / "renamed", lambda m: m.update(name="other"))
    assert "has no model 'other'" in _refused(repo, renamed) and "'tiny'" in _refused(repo, renamed)
    relabelled = _edited(new, tmp_path / "relabelled", lambda m: m.update(labels=["a", "b", "c", "d", "e"]))
    assert "labels differ" in _refused(repo, relabelled)
    resized = _edited(new, tmp_path / "resized", lambda m: m["preprocess"].update(interpolation="bicubic"))
    out = _refused(repo, resized)
    assert f"{NAME}_preprocess/config.pbtxt" in out and "bicubic" in out
    assert "config.pbtxt" in _refused(repo, new, "--top-k", "2")  # a setting every version shares
    assert "--force replaces OUT" in _refused(repo, new, "--force")
    missing = run("-a", str(new), "-o", str(repo.parent / "none"), "--new-version")
    assert missing.exit_code == 2 and "no Triton repository there" in missing.output
