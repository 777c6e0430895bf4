"""Run in the reference environment (``.venv-ref``, where open_clip is installed), with vitdeploy on PYTHONPATH:
a random-weight tiny OpenCLIP model saved as the Hub holds it, its zero-shot classes computed by vitdeploy
(``model/zero_shot.text_classes``) and by open_clip's own ``build_zero_shot_classifier``; prints what both gave.

    .venv-ref/bin/python tests/helpers/open_clip_zero_shot.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LABELS = ("zero", "one", "two")
TEMPLATES = ("a photo of a {}.", "itap of a {}.")


def main(out: Path) -> None:
    import open_clip
    import safetensors.torch
    import torch

    from vitdeploy.model.zero_shot import text_classes

    vision = {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 16}
    text = {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}
    model_cfg = {"embed_dim": 24, "quick_gelu": True, "vision_cfg": vision, "text_cfg": text}
    torch.manual_seed(0)
    model = open_clip.CLIP(**model_cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.1 * torch.randn_like(param))
        model.logit_scale.fill_(3.0)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "open_clip_model.safetensors")
    )
    (out / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}))
    ours = text_classes(out, LABELS, TEMPLATES)
    with torch.no_grad():
        library = open_clip.build_zero_shot_classifier(
            model, open_clip.get_tokenizer(f"local-dir:{out}"), LABELS, TEMPLATES
        ).T
    print(
        json.dumps(
            {
                "max_diff": float((ours.embeddings - library).abs().max()),
                "shape": list(ours.embeddings.shape),
                "logit_scale": ours.logit_scale,
                "library_scale": float(model.logit_scale.detach().exp()),
                "scores": ours.scores,
                "logit_bias": ours.logit_bias,
                "text_model": ours.text_model,
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
