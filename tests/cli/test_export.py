"""`vitdeploy export`'s closing lines: the `next:` command, as it runs from the current directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "argv0, on_path, expect",
    [
        (".venv/bin/vitdeploy", None, ".venv/bin/vitdeploy"),  # make demo: not on PATH, run from the checkout
        (".venv/bin/vitdeploy", ".venv/bin/vitdeploy", "vitdeploy"),  # activated venv
    ],
)
def test_next_command_runs_as_printed_from_the_current_directory(tmp_path, monkeypatch, argv0, on_path, expect):
    from vitdeploy.base.config import parse_config
    from vitdeploy.cli.export import next_predict_command

    monkeypatch.chdir(tmp_path)
    script = tmp_path / ".venv/bin/vitdeploy"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    (tmp_path / "vit.safetensors").write_bytes(b"")  # the config only checks that it exists
    monkeypatch.setattr(sys, "argv", [str(tmp_path / argv0)])
    monkeypatch.setattr("shutil.which", lambda name: str(tmp_path / on_path) if on_path else None)

    demo = next_predict_command(parse_config({}, None), tmp_path / "artifacts")
    assert demo == f"{expect} predict {_rel_demo_images()} -a artifacts"
    mine = parse_config({"model": {"checkpoint": "vit.safetensors"}}, tmp_path / "p.yaml")
    assert next_predict_command(mine, tmp_path / "out dir") == f"{expect} predict path/to/your/images -a 'out dir'"
    (tmp_path / "photos").mkdir()
    with_images = parse_config(
        {"model": {"checkpoint": "vit.safetensors"}, "validation": {"images": "photos"}}, tmp_path / "p.yaml"
    )
    assert next_predict_command(with_images, Path("/elsewhere/art")) == f"{expect} predict photos -a /elsewhere/art"


def _rel_demo_images() -> str:
    import os

    from vitdeploy.demo import IMAGES_DIR as DEMO_IMAGES_DIR

    rel = os.path.relpath(DEMO_IMAGES_DIR)
    return rel if not rel.startswith("..") else str(DEMO_IMAGES_DIR)
