"""CLIP image towers in their own libraries, for tests/model/test_vit_clip.py: timm's ``vit_*_clip_*`` and OpenCLIP.

Run by ``tests/helpers/library_reference.py PHOTOS OUT clip`` in the reference environment (``.venv-ref``: timm,
open-clip-torch). Each case is a tiny random-weight model of the real configuration family (the real structure:
the norm before the blocks, LayerNorm eps 1e-5, QuickGELU where the family has it, the class token through the
final norm and the projection), saved as its library saves it and read back by that library:

* timm: ``save_for_hf`` hub folders (config.json with ``architecture`` and ``pretrained_cfg``), read back with
  ``timm.create_model("local-dir:...")``; ``logits`` is ``model(x)`` on ``create_transform(resolve_data_config)``'s
  pixels. A CLIP tower's head is its projection with a zero bias, as timm's ``_convert_openai_clip`` writes it.
* OpenCLIP: a folder as the Hub holds it (``open_clip_config.json`` with ``model_cfg`` and ``preprocess_cfg``,
  ``open_clip_model.safetensors``), read back with ``open_clip.create_model_and_transforms("local-dir:...")``;
  ``logits`` is ``model.encode_image(x)`` on its own preprocessing's pixels.

Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

#: timm towers: (case, architecture, kwargs, seed, projection?): a projection's head has a zero bias
TIMM_CLIP_CASES = (
    ("timm_clip_quickgelu", "vit_base_patch16_clip_quickgelu_224", {"num_classes": 24}, 40, True),
    ("timm_clip_gelu_b32", "vit_base_patch32_clip_224", {"num_classes": 24}, 41, True),
    # a CLIP tower fine-tuned as a classifier (timm's *.openai_ft_in1k): a real head, logits
    ("timm_clip_classifier", "vit_base_patch16_clip_224", {"num_classes": 10}, 42, False),
)
#: tiny towers: width 64, 2 blocks, 2 heads (timm: 64 / 2; open_clip: head_width 32)
_TINY = {"embed_dim": 64, "depth": 2, "num_heads": 2}

#: OpenCLIP towers: (case, model_cfg's vision_cfg, quick_gelu, preprocess_cfg, seed)
OPEN_CLIP_CASES = (
    # OpenAI's ViT-B/16 family (ViT-B-16-quickgelu): QuickGELU, class token, ln_post, proj
    (
        "open_clip_quickgelu",
        {"image_size": 224, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
        True,
        {},
        50,
    ),
    # LAION's family (ViT-B-32): GELU, squash resize, its own mean / std
    (
        "open_clip_gelu_squash",
        {"image_size": 224, "layers": 2, "width": 64, "head_width": 32, "patch_size": 32},
        False,
        {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "resize_mode": "squash"},
        51,
    ),
    # the other switches of its ViT: layer scale, average pooling with the final norm after it, no ln_pre, eps 1e-6
    (
        "open_clip_avg_ls",
        {
            "image_size": 224,
            "layers": 2,
            "width": 64,
            "head_width": 32,
            "patch_size": 16,
            "ls_init_value": 0.1,
            "pool_type": "avg",
            "final_ln_after_pool": True,
            "no_ln_pre": True,
            "norm_kwargs": {"eps": 1e-6},
        },
        False,
        {},
        52,
    ),
)
_TEXT = {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1}


def timm_clip_cases(photos, out: Path, cases: dict, randomize_, run, save) -> None:
    import timm
    import torch
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    for case, arch, kwargs, seed, projection in TIMM_CLIP_CASES:
        built = randomize_(timm.create_model(arch, pretrained=False, **_TINY, **kwargs), seed)
        if projection:
            with torch.no_grad():
                built.head.bias.zero_()  # CLIP's projection, as timm's _convert_openai_clip writes it
        save_for_hf(built, str(out / case), safe_serialization=True)
        model = timm.create_model(f"local-dir:{out / case}", pretrained=True).eval()
        cfg = resolve_data_config({}, model=model)
        info = {
            "library": f"timm {timm.__version__}",
            "arch": arch,
            "checkpoint": ".",
            "data_config": json.loads(json.dumps(cfg, default=list)),
            "projection": projection,
        }
        save(out, case, info, run(model, create_transform(**cfg), photos), cases)


def open_clip_cases(photos, out: Path, cases: dict, randomize_, run, save) -> None:
    import open_clip
    import safetensors.torch

    for case, vision_cfg, quick_gelu, preprocess_cfg, seed in OPEN_CLIP_CASES:
        model_cfg = {"embed_dim": 24, "quick_gelu": quick_gelu, "vision_cfg": vision_cfg, "text_cfg": _TEXT}
        model = randomize_(open_clip.CLIP(**model_cfg), seed)
        folder = out / case
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
        safetensors.torch.save_file(tensors, str(folder / "open_clip_model.safetensors"))
        config = {
            "model_cfg": model_cfg,
            "preprocess_cfg": {
                "mean": list(open_clip.OPENAI_DATASET_MEAN),
                "std": list(open_clip.OPENAI_DATASET_STD),
                **preprocess_cfg,
            },
        }
        (folder / "open_clip_config.json").write_text(json.dumps(config, indent=2))
        loaded, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
        loaded.eval()
        info = {"library": f"open_clip {open_clip.__version__}", "checkpoint": ".", "model_cfg": model_cfg}
        save(out, case, info, run(_Encoder(loaded), preprocess, photos), cases)


class _Encoder:
    """``encode_image`` as a callable: what the reference runs on the pixels."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, pixels):
        return self.model.encode_image(pixels)


def clip_cases(photos, out: Path, cases: dict, randomize_, run, save) -> None:
    timm_clip_cases(photos, out, cases, randomize_, run, save)
    open_clip_cases(photos, out, cases, randomize_, run, save)
