"""SigLIP image towers in timm, for tests/model/test_checkpoints_siglip.py: timm's ``vit_*_siglip_*``.

Run by ``tests/helpers/library_reference.py PHOTOS OUT siglip`` in the reference environment (``.venv-ref``). Each
case is a tiny random-weight model of the real configuration family (no class token, ``global_pool='map'``: the
attention pool ``attn_pool``; so400m/14 at 384 px, off the patch grid; so400m/16's tanh GELU), saved as timm saves it
(``save_for_hf`` with the model_args, read back with ``timm.create_model("local-dir:...")``) or as a bare state dict;
``logits`` is ``model(x)`` (the embedding with num_classes=0) on ``create_transform(resolve_data_config)``'s pixels.
Keep the top level free of timm imports (the tests import ``SIGLIP_CASES``).
"""

from __future__ import annotations

from pathlib import Path

_CLASSES = 10  # the classifier case's head (library_reference.NUM_CLASSES)

#: (case, architecture, timm kwargs (saved as config.json model_args), num_classes, hub folder?, seed)
SIGLIP_CASES = (
    ("timm_siglip_b16", "vit_base_patch16_siglip_224", {"embed_dim": 64, "num_heads": 2, "depth": 2}, 0, True, 40),
    # so400m/14 at 384 px: 384 is off the 14 px grid, timm's patch convolution drops the last 6 rows and columns
    (
        "timm_siglip_so400m14_384",
        "vit_so400m_patch14_siglip_384",
        {"embed_dim": 64, "num_heads": 4, "depth": 2},
        0,
        True,
        41,
    ),
    # so400m/16 (act_layer gelu_tanh) with a classifier over the attention pool
    (
        "timm_siglip_so400m16_cls",
        "vit_so400m_patch16_siglip_256",
        {"embed_dim": 64, "num_heads": 4, "depth": 2},
        _CLASSES,
        True,
        42,
    ),
    # a bare state dict: width 192 is tiny's (3 heads, assumed), timm's SigLIP pretrained_cfg (crop_pct 0.9)
    ("timm_siglip_bare", "vit_base_patch16_siglip_224", {"embed_dim": 192, "num_heads": 3, "depth": 2}, 0, False, 43),
)


def siglip_cases(photos: list[Path], out: Path, cases: dict, randomize_, run, save, jsonable) -> None:
    """timm's SigLIP towers (``SIGLIP_CASES``): the embedding (``model(x)``, num_classes=0: the attention pool's
    output) or the classifier's logits, on timm's own preprocessing (library_reference's helpers passed in)."""
    import safetensors.torch
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    for case, arch, kwargs, num_classes, hub, seed in SIGLIP_CASES:
        model = randomize_(timm.create_model(arch, pretrained=False, num_classes=num_classes, **kwargs), seed)
        if hub:
            save_for_hf(model, str(out / case), model_args=kwargs, safe_serialization=True)
            model = timm.create_model(f"local-dir:{out / case}", pretrained=True).eval()
            checkpoint = "."
        else:
            (out / case).mkdir(parents=True, exist_ok=True)
            safetensors.torch.save_file(
                {k: v.contiguous() for k, v in model.state_dict().items()}, str(out / case / "model.safetensors")
            )
            checkpoint = "model.safetensors"
        cfg = resolve_data_config({}, model=model)
        info = {"library": f"timm {timm.__version__}", "arch": arch, "kwargs": kwargs, "checkpoint": checkpoint}
        info["data_config"] = jsonable(cfg)
        save(out, case, info, run(model, create_transform(**cfg), photos, patches=num_classes == 0), cases)
