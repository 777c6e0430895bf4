"""Checkpoints named on the Hugging Face Hub (model/hub): the real download path, with no internet.

A Hub on 127.0.0.1 (tests/helpers/fake_hub.py) answers the file API for repos written here by
transformers; ``HF_ENDPOINT`` points at it and ``HF_HOME`` is a fresh folder, so huggingface_hub itself
resolves revisions, downloads and caches. The server counts requests: HF_HUB_OFFLINE=1 makes none.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.fake_hub import FakeHub, folder_files, point_at

from vitdeploy.base.errors import CheckpointError, HubError
from vitdeploy.cli import main as cli_main
from vitdeploy.model import load_checkpoint

transformers = pytest.importorskip("transformers", reason="transformers writes the repos")
hf_constants = pytest.importorskip("huggingface_hub.constants")

TOKEN = "hf_test_secret_token_0123456789"
FAST_EXPORT = {"fp16": {"enabled": False}, "int8": {"enabled": False}, "batch": {"min": 1, "opt": 1, "max": 2}}


def save_vit(folder: Path, seed: int, **save) -> Path:
    """A tiny transformers ViT classifier with its (PIL) image processor, as save_pretrained writes them."""
    import torch

    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    )
    torch.manual_seed(seed)
    transformers.ViTForImageClassification(config).save_pretrained(folder, **save)
    transformers.ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def save_bin(folder: Path) -> Path:
    """The folder with its weights as transformers 4 wrote them by default: pytorch_model.bin (a torch.save'd
    state dict; transformers 5 writes safetensors only)."""
    import safetensors.torch
    import torch

    weights = folder / "model.safetensors"
    torch.save(safetensors.torch.load_file(str(weights)), folder / "pytorch_model.bin")
    weights.unlink()
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The fake Hub with its repos: acme/tiny-vit (tag v1 = the first commit; main = a second one with other
    weights), acme/gated (token), acme/private (token), acme/keras-only, acme/swin, acme/siglip2-naflex,
    acme/sharded, acme/bin-only."""
    transformers.logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("repos")
    server = FakeHub()
    tiny = server.add("acme/tiny-vit")
    first = save_vit(root / "first", 0)
    server.first = tiny.commit({**folder_files(first), "README.md": b"# tiny", "tf_model.h5": b"not read"}, tag="v1")
    server.main = tiny.commit(folder_files(save_vit(root / "second", 1)))
    server.gated_commit = server.add("acme/gated", token=TOKEN).commit(folder_files(first))
    server.add("acme/private", token=TOKEN, private=True).commit(folder_files(first))
    server.add("acme/keras-only").commit({"config.json": (first / "config.json").read_bytes(), "tf_model.h5": b"x"})
    swin = json.dumps({"model_type": "swin", "architectures": ["SwinForImageClassification"]}).encode()
    server.add("acme/swin").commit({"config.json": swin, "model.safetensors": b"never fetched"})
    naflex = json.dumps({"model_type": "siglip2", "architectures": ["Siglip2Model"]}).encode()
    server.add("acme/siglip2-naflex").commit({"config.json": naflex, "model.safetensors": b"never fetched"})
    server.add("acme/sharded").commit(folder_files(save_vit(root / "sharded", 2, max_shard_size="30KB")))
    server.add("acme/bin-only").commit(folder_files(save_bin(save_vit(root / "bin", 3))))
    server.folders = {"first": first, "sharded": root / "sharded", "bin": root / "bin"}
    yield server
    server.close()


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    """HF_ENDPOINT at the fake Hub, a fresh HF_HOME, no token, online (helpers/fake_hub.point_at): the cache."""
    return point_at(hub, monkeypatch, tmp_path / "hf")


def offline(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def export_cli(*args: str, out: Path, config: Path) -> tuple[int, str, dict]:
    config.write_text(json.dumps({"export": FAST_EXPORT, "validation": {"noise_samples": 1}}))
    result = CliRunner().invoke(cli_main, ["export", *args, "-c", str(config), "-o", str(out), "--engine", "skip"])
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else {}
    return result.exit_code, result.output, manifest


# --------------------------------------------------------------------------- the names, exported


@pytest.mark.integration
def test_export_from_a_repo_id_and_a_tag_pins_the_commit_and_info_prints_it(hub, env, tmp_path):
    code, output, manifest = export_cli("acme/tiny-vit", out=tmp_path / "main", config=tmp_path / "p.yaml")
    assert code == 0, output
    record = manifest["model"]["source"]["hub"]
    assert record["repo_id"] == "acme/tiny-vit" and record["revision"] is None and record["commit"] == hub.main
    served = hub.repos["acme/tiny-vit"].commits[hub.main]
    assert {f["path"]: f["sha256"] for f in record["files"]} == {
        name: sha256(served[name]) for name in ("config.json", "preprocessor_config.json", "model.safetensors")
    }
    assert manifest["model"]["source"]["path"] == f"acme/tiny-vit@{hub.main}" and manifest["name"] == "tiny-vit"
    assert manifest["preprocess_reference"]["processor"] == "ViTImageProcessorPil"
    assert manifest["preprocess_reference"]["version"] == transformers.__version__

    code, output, tagged = export_cli("acme/tiny-vit@v1", out=tmp_path / "v1", config=tmp_path / "p.yaml")
    assert code == 0, output
    assert tagged["model"]["source"]["hub"]["commit"] == hub.first
    assert tagged["model"]["source"]["hub"]["revision"] == "v1"
    weights = {m["model"]["source"]["hub"]["files"][-1]["sha256"] for m in (manifest, tagged)}
    assert len(weights) == 2  # two commits, two sets of weights

    shown = CliRunner().invoke(cli_main, ["info", "-a", str(tmp_path / "v1")])
    assert shown.exit_code == 0, shown.output
    assert f"revision v1 -> commit {hub.first}" in shown.output
    assert f"vitdeploy export acme/tiny-vit@{hub.first}" in shown.output
    assert sha256(hub.repos["acme/tiny-vit"].commits[hub.first]["model.safetensors"]) in shown.output
    assert f"transformers {transformers.__version__} ViTImageProcessorPil" in shown.output


@pytest.mark.integration
def test_a_second_export_with_hf_hub_offline_uses_the_cache_and_makes_no_request(hub, env, tmp_path):
    """The second run is a fresh `vitdeploy export` process: huggingface_hub reads HF_HUB_OFFLINE itself."""
    assert load_checkpoint(f"acme/tiny-vit@{hub.first}").hub.commit == hub.first  # warms the cache
    before = hub.count()
    (tmp_path / "p.yaml").write_text(json.dumps({"export": FAST_EXPORT, "validation": {"noise_samples": 1}}))
    proc = subprocess.run(
        [sys.executable, "-m", "vitdeploy.cli", "export", f"acme/tiny-vit@{hub.first}", "-c", str(tmp_path / "p.yaml")]
        + ["-o", str(tmp_path / "out"), "--engine", "skip"],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hub.count() == before, hub.requests[before:]
    record = json.loads((tmp_path / "out" / "manifest.json").read_text())["model"]["source"]["hub"]
    assert record["commit"] == hub.first and record["offline"] is True


def test_a_branch_is_resolved_once_offline_from_the_cache(hub, env, monkeypatch):
    online = load_checkpoint("acme/tiny-vit")
    before = hub.count()
    offline(monkeypatch)
    again = load_checkpoint("acme/tiny-vit")
    assert again.hub.commit == online.hub.commit == hub.main and hub.count() == before
    with pytest.raises(HubError, match=r"acme/tiny-vit@v1: the commit of revision 'v1' is not in the Hugging Face"):
        load_checkpoint("acme/tiny-vit", revision="v1")  # never resolved online: unknown, not guessed
    assert hub.count() == before


def test_only_the_files_an_export_reads_are_fetched_safetensors_first(hub, env):
    loaded = load_checkpoint("hf-hub:acme/tiny-vit", revision="v1")
    asked = {path.rsplit("/", 1)[-1] for _, path in hub.requests}
    assert "README.md" not in asked and "tf_model.h5" not in asked and "pytorch_model.bin" not in asked
    assert [f.path for f in loaded.hub.files] == ["config.json", "preprocessor_config.json", "model.safetensors"]


@pytest.mark.parametrize("repo, folder", [("acme/sharded", "sharded"), ("acme/bin-only", "bin")])
def test_sharded_and_bin_only_repos_load_as_their_folder_does(hub, env, repo, folder):
    import torch

    from_hub, from_folder = load_checkpoint(repo), load_checkpoint(hub.folders[folder])
    names = [f.path for f in from_hub.hub.files]
    if folder == "sharded":
        assert "model.safetensors.index.json" in names and sum(n.endswith(".safetensors") for n in names) >= 2
    else:
        assert names[-1] == "pytorch_model.bin"  # read with torch.load(weights_only=True), as from a folder
    assert from_hub.config == from_folder.config and from_hub.preprocess == from_folder.preprocess
    ours, theirs = from_hub.model.state_dict(), from_folder.model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


# --------------------------------------------------------------------------- every failure: one line, exit 2


FAILURES = {
    "no-such-repo": ("acme/nope", "acme/nope: no such model repo on http://127.0.0.1", "no token is set"),
    "private": ("acme/private", "or it is private and no token is set", "HF_TOKEN"),
    "no-such-revision": ("acme/tiny-vit@v9", "acme/tiny-vit has no revision 'v9'", "drop @v9"),
    "only-keras": ("acme/keras-only", "no weights vitdeploy reads", "tf_model.h5 (TensorFlow (Keras) weights)"),
    "unsupported": ("acme/swin", "a transformers 'swin' model, which vitdeploy does not export", "dinov2"),
    "naflex": ("acme/siglip2-naflex", "transformers' NaFlex SigLIP 2", "google/siglip2-*-patch16-224/256/384/512"),
    "offline-not-cached": ("acme/tiny-vit", "is not in the Hugging Face cache", "HF_HUB_OFFLINE=1 forbids"),
    "not-a-name": ("acme/a/b", "no such file or directory", "not a Hugging Face Hub name"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_each_failure_is_one_line_exit_2_naming_the_repo_and_nothing_is_written(hub, env, tmp_path, case, monkeypatch):
    name, said, fix = FAILURES[case]
    if case == "offline-not-cached":
        offline(monkeypatch)
    before = hub.count()
    result = CliRunner().invoke(cli_main, ["export", name, "-o", str(tmp_path / "out"), "--engine", "skip"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and said in lines[0] and fix in lines[0], result.output
    written = {p.name for p in (tmp_path / "out").iterdir()} if (tmp_path / "out").exists() else set()
    assert "Traceback" not in result.output and written <= {"export-report.json"}  # the failure's report only
    assert not any("/cdn/" in p for _, p in hub.requests[before:])  # no weights downloaded


def test_a_gated_repo_without_then_with_a_token_never_shows_it(hub, env, monkeypatch):
    with pytest.raises(HubError) as refused:
        load_checkpoint("acme/gated")
    assert "acme/gated is a gated repo" in str(refused.value) and "no token is set" in str(refused.value)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_token_9876543210")
    with pytest.raises(HubError, match="a token was sent but has no access") as wrong:
        load_checkpoint("acme/gated")
    assert "hf_wrong_token" not in str(wrong.value)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    result = CliRunner().invoke(cli_main, ["info", "acme/gated"])
    assert result.exit_code == 0, result.output
    assert f"commit {hub.gated_commit}" in result.output and TOKEN not in result.output


def test_a_download_cut_midway_leaves_nothing_a_later_run_reads(hub, env):
    weights = hub.repos["acme/tiny-vit"].commits[hub.first]["model.safetensors"]
    hub.cut("model.safetensors")
    try:
        with pytest.raises(HubError, match=r"acme/tiny-vit@v1: downloading model.safetensors .* failed .* run the"):
            load_checkpoint("acme/tiny-vit@v1")
        leftovers = [
            p for p in env.rglob("*") if p.is_file() and (p.suffix == ".incomplete" or p.name == sha256(weights))
        ]
        assert not leftovers  # no partial blob, under its final name or another
    finally:
        hub.heal()
    loaded = load_checkpoint("acme/tiny-vit@v1")
    assert loaded.hub.files[-1].sha256 == sha256(weights)


def test_a_corrupt_cached_blob_is_refused_naming_it(hub, env):
    loaded = load_checkpoint("acme/tiny-vit@v1")
    blob = (loaded.hub.folder / "model.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    with pytest.raises(HubError, match=r"the cached model.safetensors is corrupt .* delete .* and run again"):
        load_checkpoint(f"acme/tiny-vit@{hub.first}")


def test_a_path_that_exists_wins_over_a_hub_name(hub, env, tmp_path, monkeypatch):
    local = save_vit(tmp_path / "acme" / "tiny-vit", 5)
    monkeypatch.chdir(tmp_path)
    before = hub.count()
    assert load_checkpoint("acme/tiny-vit").hub is None and hub.count() == before
    assert load_checkpoint(local).name == "tiny-vit"
    with pytest.raises(CheckpointError, match="a revision .* applies to a Hub name"):
        load_checkpoint("acme/tiny-vit", revision="v1")
