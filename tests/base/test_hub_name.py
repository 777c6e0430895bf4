"""What model.checkpoint / MODEL names (base/hub_name.py): a path that exists, or a Hub name, told apart up front."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.base.hub_name import HubName, checkpoint_ref, parse_hub_name


@pytest.mark.parametrize(
    "text, revision, expected",
    [
        ("google/vit-base-patch16-224", None, HubName("google/vit-base-patch16-224")),
        ("google/vit-base-patch16-224@main", None, HubName("google/vit-base-patch16-224", "main")),
        ("facebook/dinov2-small@refs/pr/4", None, HubName("facebook/dinov2-small", "refs/pr/4")),
        ("org/name", "v1.0", HubName("org/name", "v1.0")),
        (
            "hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
            None,
            HubName("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"),
        ),
        ("missing/vit.safetensors", None, None),  # a file that does not exist, not a repo
        ("a/b/c", None, None),
        ("plainname", None, None),
        ("org/na--me", None, None),
    ],
)
def test_the_name_forms(text, revision, expected):
    assert parse_hub_name(text, revision) == expected


def test_contradicting_revisions_and_bad_prefixed_names_are_refused():
    with pytest.raises(ConfigError, match="pins revision 'v1' but the revision given is 'v2'"):
        parse_hub_name("org/name@v1", "v2")
    with pytest.raises(ConfigError, match="not a Hub name; after hf-hub: give a repo id"):
        parse_hub_name("hf-hub:nope")


def test_a_path_that_exists_wins_and_a_revision_needs_a_hub_name(tmp_path: Path):
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert checkpoint_ref("org/name", tmp_path) == tmp_path / "org" / "name"
    assert checkpoint_ref("org/other", tmp_path) == HubName("org/other")
    with pytest.raises(ConfigError, match="applies only to a Hugging Face Hub name"):
        checkpoint_ref("org/name", tmp_path, "v1")
    with pytest.raises(ConfigError, match="no such file or directory .* and not a Hugging Face Hub name"):
        checkpoint_ref("./missing", tmp_path)


def test_the_config_takes_a_hub_name_and_the_command_line_overrides_it(tmp_path: Path, monkeypatch):
    cfg = parse_config({"model": {"checkpoint": "google/vit-base-patch16-224", "revision": "abc123"}}, None)
    assert cfg.checkpoint_ref == HubName("google/vit-base-patch16-224", "abc123")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    assert cfg.with_checkpoint("ckpt", None).checkpoint_ref == tmp_path / "ckpt"  # the shell's path
    other = cfg.with_checkpoint("timm/vit_small_patch16_224.augreg_in21k", "v2")
    assert other.checkpoint_ref == HubName("timm/vit_small_patch16_224.augreg_in21k", "v2")  # not the file's revision
    with pytest.raises(ConfigError, match="MODEL"):
        cfg.with_checkpoint("./nothing/here.safetensors", None)
