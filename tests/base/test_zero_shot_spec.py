"""``model.zero_shot`` (base/zero_shot_spec.py) and ``vitdeploy export --labels / --template``: the class names from
a list or a labels file (relative to the pipeline.yaml), the templates' one slot, CLIP's defaults, and each bad
value refused in one line naming the key or the file before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitdeploy.base.config import load_config, parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.base.zero_shot_spec import DEFAULT_TEMPLATES, class_names, read_labels


def test_labels_from_a_list_or_a_file_beside_the_yaml(tmp_path: Path):
    (tmp_path / "classes.txt").write_text("cat\n\n  dog  \nred fox\n", encoding="utf-8")
    (tmp_path / "pipeline.yaml").write_text("model:\n  zero_shot:\n    labels: classes.txt\n", encoding="utf-8")
    cfg = load_config(tmp_path / "pipeline.yaml")
    assert class_names(cfg.model.zero_shot, cfg.base_dir) == ("cat", "dog", "red fox")
    assert cfg.model.zero_shot.prompts == DEFAULT_TEMPLATES and "a origami {}." in DEFAULT_TEMPLATES
    listed = parse_config({"model": {"zero_shot": {"labels": ["cat", "dog"], "templates": ["a photo of a {}."]}}})
    assert class_names(listed.model.zero_shot, Path("/nowhere")) == ("cat", "dog")
    assert listed.model.zero_shot.prompts == ("a photo of a {}.",)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"labels": ["cat"]}, "1 class name(s); a classifier needs at least two"),
        ({"labels": ["cat", "cat"]}, "the class name 'cat' appears twice"),
        ({"labels": ["cat", " "]}, "class name 1 is blank"),
        ({"labels": ["cat", "dog"], "templates": ["a photo"]}, "must hold '{}' exactly once"),
        ({"labels": ["cat", "dog"], "templates": ["{} and {}"]}, "must hold '{}' exactly once"),
        ({"labels": ["cat", "dog"], "templates": ["{0} x {}"]}, "must hold '{}' exactly once"),
        ({"labels": ["cat", "dog"], "templates": []}, "at least one template"),
        ({"labels": ["cat", "dog"], "prompts": ["{}"]}, "unknown key 'model.zero_shot.prompts'"),
        ({"templates": ["{}"]}, "'model.zero_shot.labels' is missing"),
    ],
)
def test_bad_zero_shot_sections_are_refused_naming_the_key(section, message):
    with pytest.raises(ConfigError, match="model.zero_shot") as info:
        parse_config({"model": {"zero_shot": section}})
    assert message in str(info.value)


@pytest.mark.parametrize("key, value", [("output", "embedding"), ("normalize", True), ("patch_tokens", True)])
def test_zero_shot_is_a_classifier_and_refuses_embedding_keys(key, value):
    with pytest.raises(ConfigError, match="zero_shot"):
        parse_config({"model": {key: value, "zero_shot": {"labels": ["cat", "dog"]}}})


def test_the_command_lines_labels_and_templates(tmp_path: Path, monkeypatch):
    """--labels FILE is relative to the current folder; --template replaces the config's templates."""
    monkeypatch.chdir(tmp_path)
    Path("names.txt").write_text("cat\ndog\n", encoding="utf-8")
    cfg = parse_config({"model": {"zero_shot": {"labels": ["a", "b"], "templates": ["x {}"]}}})
    assert cfg.with_zero_shot(None, ()) is cfg
    given = cfg.with_zero_shot(Path("names.txt"), ("a {} photo", "the {}"))
    assert given.model.zero_shot.labels == tmp_path / "names.txt"
    assert class_names(given.model.zero_shot, Path("/elsewhere")) == ("cat", "dog")
    assert given.model.zero_shot.prompts == ("a {} photo", "the {}")
    assert cfg.with_zero_shot(None, ("the {}",)).model.zero_shot.labels == ("a", "b")  # the config's labels kept
    with pytest.raises(ConfigError, match="--template needs class names"):
        parse_config({}).with_zero_shot(None, ("the {}",))
    with pytest.raises(ConfigError, match="--labels / --template: 'model.zero_shot.templates'"):
        parse_config({}).with_zero_shot(Path("names.txt"), ("no slot",))


def test_a_labels_file_that_cannot_be_used_is_named(tmp_path: Path):
    with pytest.raises(ConfigError, match="missing.txt: cannot read the labels file"):
        read_labels(tmp_path / "missing.txt")
    (tmp_path / "one.txt").write_text("only\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="one.txt: 1 class name"):
        read_labels(tmp_path / "one.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00cat")
    with pytest.raises(ConfigError, match="bin.txt: cannot read the labels file"):
        read_labels(tmp_path / "bin.txt")
