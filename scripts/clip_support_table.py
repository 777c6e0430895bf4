"""Every CLIP image tower timm, OpenCLIP and transformers ship, and what vitdeploy does with it: loads, or the one
line that refuses it naming the part. Generated from the libraries' own lists (timm ``list_models('vit_*clip*')``,
``open_clip.list_models()``, transformers' CLIP classes), each model built on the meta device (no weights, no
download) and put through vitdeploy's own conversion, config reading and strict key check.

Runs in the reference environment (timm, open-clip-torch, transformers) with the repository on the path:

    PYTHONPATH=. .venv-ref/bin/python scripts/clip_support_table.py > /tmp/clip-table.md

Its output is the table in docs/checkpoints.md ("Every CLIP tower the libraries ship").
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vitdeploy.base.errors import CheckpointError
from vitdeploy.model.checkpoints import _check_strict
from vitdeploy.model.vit import VisionTransformer


def _verdict(state: dict, read_config, where: Path, fmt: str) -> str:
    """'loads' or the refusal's part, for a state dict of meta tensors converted to our names."""
    try:
        cfg = read_config(state)
        with torch.device("meta"):
            model = VisionTransformer(cfg)
        _check_strict(model, state, where, fmt)
    except CheckpointError as exc:
        text = str(exc)
        part = text.split("The model has parts vitdeploy's ViT does not: ")[-1]
        return "refused: " + part.split(f"{where}: ")[-1].split("; ")[0][:160]
    summary = cfg.family_summary()
    return f"loads ({cfg.width} wide, {cfg.depth} blocks, {cfg.heads} heads, {cfg.image_size} px; {summary})"


def timm_rows() -> list[tuple[str, str]]:
    import timm

    from vitdeploy.model.formats.timm.convert import timm_vit_config

    rows = []
    for name in timm.list_models("vit_*clip*"):
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, num_classes=512)
        state = dict(model.state_dict())
        state["proj.weight"] = state.pop("head.weight")  # CLIP's projection: timm's head with a zero bias
        state.pop("head.bias")
        where = Path(name)
        read = lambda s, n=name, w=where: timm_vit_config(s, w, None, {"architecture": n})[0]  # noqa: E731
        rows.append((f"timm `{name}`", _verdict(state, read, where, "timm")))
    return rows


def open_clip_rows() -> list[tuple[str, str]]:
    import open_clip

    from vitdeploy.model.formats.open_clip.convert import convert_open_clip_state_dict, open_clip_vit_config

    rows = []
    for name in open_clip.list_models():
        cfg = open_clip.get_model_config(name)
        meta = {"model_cfg": cfg}
        where = Path(name)
        try:
            with torch.device("meta"):
                model = _open_clip_meta(open_clip, cfg)
            state = convert_open_clip_state_dict(dict(model.state_dict()), meta)
        except _ConfigOnly:  # refused by its config before any tensor
            rows.append((f"OpenCLIP `{name}`", _config_verdict(meta, where, open_clip_vit_config)))
            continue
        except Exception as exc:  # noqa: BLE001 - a tower open_clip cannot build here: said, not hidden
            rows.append((f"OpenCLIP `{name}`", f"not built here ({type(exc).__name__}: {str(exc)[:80]})"))
            continue
        read = lambda s, m=meta, w=where: open_clip_vit_config(s, m, w)[0]  # noqa: E731
        rows.append((f"OpenCLIP `{name}`", _verdict(state, read, where, "open_clip")))
    return rows


def _open_clip_meta(open_clip, cfg: dict):
    """The model of ``cfg`` on the meta device (its image tower only matters; a timm trunk or HF text tower
    needs the library's own build)."""
    vision = cfg.get("vision_cfg", {})
    if vision.get("timm_model_name") or isinstance(vision.get("layers"), (list, tuple)):
        raise _ConfigOnly()
    return open_clip.model._build_vision_tower(cfg["embed_dim"], vision, cfg.get("quick_gelu", False))


class _ConfigOnly(Exception):
    pass


def _config_verdict(meta: dict, where: Path, read) -> str:
    try:
        read({}, meta, where)
    except CheckpointError as exc:
        return "refused: " + str(exc).split(f"{where}: ")[-1][:160]
    return "?"


def transformers_rows() -> list[tuple[str, str]]:
    import transformers

    from vitdeploy.model.formats.hf.convert import convert_hf_state_dict, hf_vit_config

    rows = []
    for cls, config in (
        ("CLIPVisionModelWithProjection", transformers.CLIPVisionConfig()),
        ("CLIPVisionModel", transformers.CLIPVisionConfig()),
        ("CLIPModel", transformers.CLIPConfig()),
    ):
        with torch.device("meta"):
            model = getattr(transformers, cls)(config)
        state = convert_hf_state_dict(dict(model.state_dict()))
        where = Path(cls)
        read = lambda s, c=config, w=where: hf_vit_config(c.to_dict(), 0, w, s)  # noqa: E731
        rows.append((f"transformers `{cls}` (its default config)", _verdict(state, read, where, "hf")))
    return rows


def main() -> int:
    rows = []
    for group in (transformers_rows, timm_rows, open_clip_rows):
        try:
            rows += group()
        except ImportError as exc:
            print(f"skipped {group.__name__}: {exc}", file=sys.stderr)
    print("| model | vitdeploy |")
    print("|-------|-----------|")
    for name, verdict in rows:
        print(f"| {name} | {verdict.replace('|', '/')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
