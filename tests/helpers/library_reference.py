"""Each library running its own model and its own preprocessing: the reference for
tests/model/test_checkpoints_library_fidelity.py.

Runs in the reference environment (``.venv-ref``: timm, torchvision, transformers, safetensors,
numpy, pillow; built by ``make reference-env``), which cannot live beside vitdeploy's CPU torch.

    .venv-ref/bin/python tests/helpers/library_reference.py PHOTOS_DIR OUT_DIR [family]

(``family``: only the timm ViT relatives of issue 15: registers, average pooling, layer scale ...;
``embedding``: only headless timm backbones, ``num_classes=0``; ``eva``: timm's EVA-02 at two sizes;
``eva_archs``: every timm EVA-02 / EVA-01 architecture, one block; ``clip``: CLIP image towers of timm and OpenCLIP,
``clip_reference.py``; ``siglip``: timm's SigLIP towers, ``siglip_reference.py``; ``processors``: transformers'
two image processors of each ``PROCESSOR_CASES`` entry on every image as it is, transparency included; ``hub``: one
timm hub folder saved by timm, for the Hub path)

For every case it writes, under ``OUT_DIR/<case>/``, the checkpoint exactly as the library saves it
and ``reference.npz``: ``pixels`` (N, 3, H, W) from the library's own preprocessing of each photo
(sorted by file name) and ``logits`` from the library's eager model on those pixels. ``cases.json``
says what each case is. Nothing is downloaded: the models have random weights.

Only ``randomize_`` is imported by the tests themselves (for transformers models); keep the
module's top level free of timm / torchvision imports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")
NUM_CLASSES = 10


def randomize_(model, seed: int):
    """Random weights large enough that attention is far from uniform and every class can win:
    LayerNorm weights 1 +- 0.1, class token / position table std 0.5, everything else std 0.1."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            low = name.lower()
            if ("norm" in low or ".ln" in low or low.startswith("ln")) and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif any(k in low for k in ("cls_token", "class_token", "pos_embed", "position")):
                param.copy_(0.5 * noise)
            else:
                param.copy_(0.1 * noise)
    return model.eval()


def _photos(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)


def _run(model, transform, photos: list[Path], patches: bool = False) -> dict[str, np.ndarray]:
    """The library's preprocessing of each photo (opened as its docs show: PIL, RGB) and its model's logits (with
    ``patches``, a headless timm model's: also ``patch_tokens``, ``forward_features`` past ``num_prefix_tokens``)."""
    import torch
    from PIL import Image

    pixels = torch.stack([transform(Image.open(p).convert("RGB")) for p in photos])
    out = {"pixels": pixels.numpy().astype(np.float32)}
    if model is not None:
        with torch.no_grad():
            out["logits"] = model(pixels).float().numpy()
            if patches:
                out["patch_tokens"] = model.forward_features(pixels)[:, model.num_prefix_tokens :].float().numpy()
    return out


def _save(out: Path, case: str, info: dict, arrays: dict[str, np.ndarray], cases: dict) -> None:
    (out / case).mkdir(parents=True, exist_ok=True)
    np.savez(out / case / "reference.npz", **arrays)
    cases[case] = info


def timm_cases(photos: list[Path], out: Path, cases: dict) -> None:
    import safetensors.torch
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    def eval_transform(model):
        cfg = resolve_data_config({}, model=model)
        return cfg, create_transform(**cfg)

    # 1. bare state dicts: what timm would do with the model it builds for that architecture
    # (deit at its full depth: the test names it as model.variant, which is checked against the tensors)
    for case, arch, kwargs, seed in (
        ("timm_bare", "vit_tiny_patch16_224", {"depth": 2}, 0),
        ("timm_heads6", "vit_tiny_patch16_224", {"depth": 2, "num_heads": 6}, 1),
        ("timm_deit", "deit_tiny_patch16_224", {}, 2),
    ):
        model = randomize_(timm.create_model(arch, pretrained=False, num_classes=NUM_CLASSES, **kwargs), seed)
        cfg, transform = eval_transform(model)
        (out / case).mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file(
            {k: v.contiguous() for k, v in model.state_dict().items()}, str(out / case / "model.safetensors")
        )
        _save(
            out,
            case,
            {
                "library": f"timm {timm.__version__}",
                "arch": arch,
                "kwargs": kwargs,
                "checkpoint": "model.safetensors",
                "data_config": _jsonable(cfg),
            },
            _run(model, transform, photos),
            cases,
        )

    # 2. hub directories written by timm itself (save_for_hf), read back by timm ("local-dir:")
    imagenet = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
    for case, kwargs, data_config, seed in (
        ("timm_hub_gelu_tanh", {"act_layer": "gelu_tanh"}, None, 3),
        ("timm_hub_squash", {}, {"crop_mode": "squash", "crop_pct": 0.9, "interpolation": "bilinear", **imagenet}, 4),
        ("timm_hub_border", {}, {"crop_mode": "border", "crop_pct": 0.875, "interpolation": "bicubic", **imagenet}, 5),
    ):
        built = randomize_(
            timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, num_classes=NUM_CLASSES, **kwargs),
            seed,
        )
        save_for_hf(built, str(out / case), safe_serialization=True, data_config=data_config)
        model = timm.create_model(f"local-dir:{out / case}", pretrained=True).eval()
        cfg, transform = eval_transform(model)
        _save(
            out,
            case,
            {
                "library": f"timm {timm.__version__}",
                "checkpoint": ".",
                "kwargs": kwargs,
                "data_config": _jsonable(cfg),
            },
            _run(model, transform, photos),
            cases,
        )


#: The ViT relatives (issue 15): (case, architecture, timm kwargs, saved as a hub folder?, seed).
FAMILY_CASES = (
    # DINOv2-style: 4 registers, no prefix positions, layer scale; class-token pooling
    (
        "timm_reg4_ls",
        "vit_tiny_patch16_224",
        {"reg_tokens": 4, "no_embed_class": True, "init_values": 1e-5},
        False,
        10,
    ),
    # no class token, average pooling with fc_norm, qk-norm
    (
        "timm_avg_fcnorm_qknorm",
        "vit_tiny_patch16_224",
        {"global_pool": "avg", "class_token": False, "qk_norm": True},
        False,
        11,
    ),
    # average pooling without fc_norm, class token kept: only config.json can tell
    ("timm_hub_avg_no_fcnorm", "vit_tiny_patch16_224", {"global_pool": "avg", "fc_norm": False}, True, 12),
    # registers + average pooling + fc_norm + layer scale, hub folder
    (
        "timm_hub_reg_avg",
        "vit_tiny_patch16_224",
        {"reg_tokens": 2, "global_pool": "avg", "init_values": 0.1},
        True,
        13,
    ),
    # DeiT distilled: class and distillation heads averaged at inference
    ("timm_deit_distilled", "deit_tiny_distilled_patch16_224", {}, False, 14),
    # DINOv2 giant's family at tiny width: SwiGLUPacked MLP (fc1 192 -> 2 x 512), layer scale, 4 registers;
    # its pretrained_cfg (518 px) brought to the model's 224 px
    (
        "timm_swiglu_dinov2",
        "vit_giant_patch14_reg4_dinov2",
        {"embed_dim": 192, "num_heads": 3, "img_size": 224, "pretrained_cfg_overlay": {"input_size": (3, 224, 224)}},
        False,
        15,
    ),
)


#: headless backbones (num_classes=0: ``model(x)`` is the pooled feature vector), for the embedding tests
EMBEDDING_CASES = (
    ("timm_headless_token", "vit_tiny_patch16_224", {}, False, 20),
    # DINOv2-like registers, layer scale, average pooling with fc_norm, as a hub folder
    (
        "timm_headless_reg_avg",
        "vit_tiny_patch16_224",
        {"reg_tokens": 4, "no_embed_class": True, "init_values": 0.1, "global_pool": "avg"},
        True,
        21,
    ),
    # DINOv2 giant's family headless, at tiny width (SwiGLUPacked, layer scale, 4 registers)
    (
        "timm_headless_swiglu",
        "vit_giant_patch14_reg4_dinov2",
        {"embed_dim": 192, "num_heads": 3, "img_size": 224, "pretrained_cfg_overlay": {"input_size": (3, 224, 224)}},
        False,
        22,
    ),
)


def family_cases(
    photos: list[Path], out: Path, cases: dict, table: tuple = FAMILY_CASES, num_classes: int = NUM_CLASSES
) -> None:
    import safetensors.torch
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    for case, arch, kwargs, hub, seed in table:
        model = randomize_(timm.create_model(arch, pretrained=False, num_classes=num_classes, depth=2, **kwargs), seed)
        if hub:
            save_for_hf(model, str(out / case), safe_serialization=True)
            model = timm.create_model(f"local-dir:{out / case}", pretrained=True).eval()
            checkpoint = "."
        else:
            (out / case).mkdir(parents=True, exist_ok=True)
            safetensors.torch.save_file(
                {k: v.contiguous() for k, v in model.state_dict().items()}, str(out / case / "model.safetensors")
            )
            checkpoint = "model.safetensors"
        cfg = resolve_data_config({}, model=model)
        _save(
            out,
            case,
            {
                "library": f"timm {timm.__version__}",
                "arch": arch,
                "kwargs": kwargs,
                "checkpoint": checkpoint,
                "data_config": _jsonable(cfg),
            },
            _run(model, create_transform(**cfg), photos, patches=num_classes == 0),
            cases,
        )


#: EVA-02 (timm eva.py) at tiny width (64, 2 heads, 2 blocks) and 112 px (grid 8, its rotary positions scaled to
#: timm's 16 x 16 ref_feat_shape), each run by timm with dynamic_img_size=True at every EVA_SIZES side:
#: (case, architecture, timm kwargs, saved as a hub folder?, seed)
EVA_SIZES = (112, 168)
EVA_CASES = (
    # EVA-02 B/L's structure: separate q/k/v (q and v biases), SwiGLU with fc1_g / fc1_x, the norm inside the MLP;
    # average pooling + fc_norm; a classifier, timm's hub folder
    ("timm_eva02_base_cls", "eva02_base_patch14_224", {"num_classes": NUM_CLASSES}, True, 40),
    # EVA-02 Ti/S's: one qkv with q_bias / v_bias, the packed SwiGLU (GluMlp); headless (the MIM backbone's
    # embedding), a bare state dict
    ("timm_eva02_tiny_embed", "eva02_tiny_patch14_224", {"num_classes": 0}, False, 41),
    # EVA-CLIP's image tower: the norm on the attention output, class-token pooling, the projection as the head
    ("timm_eva02_clip", "eva02_base_patch16_clip_224", {"num_classes": 32}, True, 42),
)


def eva_cases(photos: list[Path], out: Path, cases: dict) -> None:
    import safetensors.torch
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    for case, arch, kwargs, hub, seed in EVA_CASES:
        args = dict(depth=2, embed_dim=64, num_heads=2, img_size=112, **kwargs)
        args["pretrained_cfg_overlay"] = {"input_size": (3, 112, 112)}
        model = randomize_(timm.create_model(arch, pretrained=False, **args), seed)
        if hub:
            save_for_hf(model, str(out / case), safe_serialization=True)
            checkpoint = "."
        else:
            (out / case).mkdir(parents=True, exist_ok=True)
            state = {k: v.contiguous() for k, v in model.state_dict().items()}
            safetensors.torch.save_file(state, str(out / case / "model.safetensors"))
            checkpoint = "model.safetensors"
        dynamic = timm.create_model(arch, pretrained=False, dynamic_img_size=True, **args)
        dynamic.load_state_dict(model.state_dict())
        dynamic.eval()
        patch = model.patch_embed.patch_size[0]
        arrays, configs = {}, {}
        for side in (s // 14 * patch for s in EVA_SIZES):
            cfg = resolve_data_config({"input_size": (3, side, side)}, model=model)
            run = _run(dynamic, create_transform(**cfg), photos)
            arrays.update({f"{k}_{side}": v for k, v in run.items()})
            configs[side] = _jsonable(cfg)
        info = {"library": f"timm {timm.__version__}", "arch": arch, "checkpoint": checkpoint, "data_config": configs}
        _save(out, case, info, arrays, cases)


def eva_arch_cases(out: Path, cases: dict) -> None:
    """Every architecture timm registers under EVA's names (eva.py's EVA-02 and EVA-01 giants, vision_transformer's
    EVA-01 large), its structure at tiny width
    (64, 2 heads, one block; its own image size and the default pretrained tag's head), saved as a timm hub folder;
    its output on one random input."""
    import timm
    import torch
    from timm.models import save_for_hf

    for i, arch in enumerate(sorted(set(timm.list_models(["eva02_*", "eva_*"])))):
        model = randomize_(
            timm.create_model(arch, pretrained=False, depth=1, embed_dim=64, num_heads=2), 50 + i
        ).eval()
        save_for_hf(model, str(out / arch), safe_serialization=True)
        side = model.pretrained_cfg["input_size"][-1]
        x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            arrays = {"pixels": x.numpy(), "logits": model(x).numpy()}
        _save(out, arch, {"library": f"timm {timm.__version__}", "arch": arch, "checkpoint": "."}, arrays, cases)


def torchvision_cases(photos: list[Path], out: Path, cases: dict) -> None:
    import torch
    import torchvision
    from torchvision.models import vision_transformer as tvv

    # a small ViT with the B/16 patch and image size: its state dict carries no preprocessing, and
    # the documented transforms of ViT_B_16_Weights.IMAGENET1K_V1 are the convention it gets
    model = randomize_(
        tvv.VisionTransformer(
            image_size=224,
            patch_size=16,
            num_layers=2,
            num_heads=3,
            hidden_dim=192,
            mlp_dim=768,
            num_classes=NUM_CLASSES,
        ),
        6,
    )
    (out / "torchvision_b16").mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "torchvision_b16" / "model.pth")
    transform = tvv.ViT_B_16_Weights.IMAGENET1K_V1.transforms()
    _save(
        out,
        "torchvision_b16",
        {
            "library": f"torchvision {torchvision.__version__}",
            "checkpoint": "model.pth",
            "transforms": "ViT_B_16_Weights.IMAGENET1K_V1",
        },
        _run(model, transform, photos),
        cases,
    )

    # every ViT weight's documented transform, pixels only (width, patch, image size say which)
    shapes = {
        "ViT_B_16": (768, 16),
        "ViT_B_32": (768, 32),
        "ViT_L_16": (1024, 16),
        "ViT_L_32": (1024, 32),
        "ViT_H_14": (1280, 14),
    }
    for enum_name, (width, patch) in shapes.items():
        for weights in getattr(tvv, f"{enum_name}_Weights"):
            if weights.name == "IMAGENET1K_SWAG_LINEAR_V1" and enum_name != "ViT_H_14":
                continue  # same tensors as IMAGENET1K_V1: vitdeploy takes IMAGENET1K_V1 (documented limit)
            case = f"torchvision_{enum_name}_{weights.name}"
            size = weights.meta["min_size"][0]
            _save(
                out,
                case,
                {
                    "library": f"torchvision {torchvision.__version__}",
                    "width": width,
                    "patch": patch,
                    "image_size": size,
                    "transforms": f"{enum_name}_Weights.{weights.name}",
                },
                _run(None, weights.transforms(), photos),
                cases,
            )


#: transformers image processors (class without the backend suffix, its arguments): ViT, DeiT (their class
#: leaves do_convert_rgb unset) and DINOv2's Bit (converts to RGB)
PROCESSOR_CASES = {
    "vit-hw-224": ("ViTImageProcessor", {"size": {"height": 224, "width": 224}}),
    "deit-256-crop-224": ("DeiTImageProcessor", {}),
    "bit-shortest-256-crop-224": (
        "BitImageProcessor",
        {"size": {"shortest_edge": 256}, "crop_size": {"height": 224, "width": 224}},
    ),
}


def processor_cases(images: list[Path], out: Path, cases: dict) -> None:
    """Each case's PIL processor (``<class>Pil``, the one vitdeploy mirrors), its torchvision one (``<class>``,
    "fast"), and the PIL one told to convert to RGB, on every image opened as it is (no convert("RGB")):
    ``<role>_<i>`` arrays, or the error each raised; the processor config saved as the Hub would hold it."""
    import transformers
    from PIL import Image

    transformers.logging.set_verbosity_error()
    for case, (cls, kwargs) in PROCESSOR_CASES.items():
        folder = out / case
        getattr(transformers, cls + "Pil")(**kwargs).save_pretrained(folder)
        roles = {
            "pil": getattr(transformers, cls + "Pil")(**kwargs),
            "fast": getattr(transformers, cls)(**kwargs),
            "pil_rgb": getattr(transformers, cls + "Pil")(**{**kwargs, "do_convert_rgb": True}),
        }
        arrays, errors = {}, {}
        for i, path in enumerate(images):
            for role, processor in roles.items():
                try:
                    arrays[f"{role}_{i}"] = processor(images=Image.open(path), return_tensors="np")["pixel_values"][0]
                except Exception as exc:  # noqa: BLE001 - a refusal is a result here
                    errors[f"{role}_{i}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        default = transformers.AutoImageProcessor.from_pretrained(folder)
        _save(
            out,
            case,
            {
                "library": f"transformers {transformers.__version__}",
                "default_backend": default.backend,
                "errors": errors,
                "std": list(roles["pil"].image_std),
            },
            arrays,
            cases,
        )


def hub_cases(photos: list[Path], out: Path, cases: dict) -> None:
    """One timm hub folder written by timm (save_for_hf) and read back by timm, with its reference pixels and
    logits: what the Hub path must reproduce."""
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    case = "timm_hub_for_hub"
    built = randomize_(
        timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, num_classes=NUM_CLASSES), 30
    )
    save_for_hf(built, str(out / case), safe_serialization=True)
    model = timm.create_model(f"local-dir:{out / case}", pretrained=True).eval()
    cfg = resolve_data_config({}, model=model)
    info = {"library": f"timm {timm.__version__}", "checkpoint": ".", "data_config": _jsonable(cfg)}
    _save(out, case, info, _run(model, create_transform(**cfg), photos), cases)


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=list))


def main(argv: list[str]) -> int:
    photos_dir, out = Path(argv[1]), Path(argv[2])
    photos = _photos(photos_dir)
    if not photos:
        print(f"no photos in {photos_dir}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    cases: dict = {}
    if argv[3:] == ["family"]:
        family_cases(photos, out, cases)
    elif argv[3:] == ["embedding"]:
        family_cases(photos, out, cases, EMBEDDING_CASES, num_classes=0)
    elif argv[3:] == ["processors"]:
        processor_cases(photos, out, cases)
    elif argv[3:] == ["eva"]:
        eva_cases(photos, out, cases)
    elif argv[3:] == ["eva_archs"]:
        eva_arch_cases(out, cases)
    elif argv[3:] == ["hub"]:
        hub_cases(photos, out, cases)
    elif argv[3:] == ["clip"]:  # CLIP image towers: timm vit_*_clip_* and OpenCLIP (tests/helpers/clip_reference.py)
        from clip_reference import clip_cases

        clip_cases(photos, out, cases, randomize_, _run, _save)
    elif argv[3:] == ["siglip"]:  # SigLIP towers: timm vit_*_siglip_* (tests/helpers/siglip_reference.py)
        from siglip_reference import siglip_cases

        siglip_cases(photos, out, cases, randomize_, _run, _save, _jsonable)
    else:
        timm_cases(photos, out, cases)
        torchvision_cases(photos, out, cases)
    (out / "cases.json").write_text(json.dumps({"photos": [p.name for p in photos], "cases": cases}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
