"""Step 1 of bench_ort_speed.py, run with the *bench* venv's python (transformers<4.58 + optimum-onnx).

Creates a random-weight (seeded) Hugging Face ``ViTForImageClassification`` with the ViT-B/16-224
config, saves it to OUT/hf, and exports it with ``optimum-cli export onnx --task image-classification``
to OUT/optimum/model.onnx. Prints one JSON line with the versions used. No downloads: the config is
built here, not fetched.

    .venv-bench/bin/python benchmarks/make_optimum_export.py --out /tmp/vit-bench
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# ViT-B/16 at 224 (Dosovitskiy et al., Table 1); HF's defaults for the rest (erf GELU, eps 1e-12).
VIT_B16 = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    image_size=224,
    patch_size=16,
    num_channels=3,
    num_labels=1000,
    hidden_act="gelu",
    qkv_bias=True,
    layer_norm_eps=1e-12,
)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "missing"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for hf/ and optimum/")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opset", type=int, default=None, help="pass --opset to optimum-cli (default: optimum's choice)")
    args = ap.parse_args()

    import torch
    from transformers import ViTConfig, ViTForImageClassification

    hf_dir, opt_dir = args.out / "hf", args.out / "optimum"
    torch.manual_seed(args.seed)
    model = ViTForImageClassification(ViTConfig(**VIT_B16)).eval()
    model.save_pretrained(hf_dir)

    cli = Path(sys.executable).with_name("optimum-cli")
    cmd = [str(cli), "export", "onnx", "--model", str(hf_dir), "--task", "image-classification"]
    if args.opset:
        cmd += ["--opset", str(args.opset)]
    cmd.append(str(opt_dir))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not (opt_dir / "model.onnx").is_file():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        sys.stderr.write(f"\noptimum-cli failed (exit {proc.returncode}): {' '.join(cmd)}\n")
        return 1
    print(
        json.dumps(
            {
                "hf_dir": str(hf_dir),
                "optimum_onnx": str(opt_dir / "model.onnx"),
                "command": " ".join(cmd),
                "seed": args.seed,
                "config": VIT_B16,
                "versions": {
                    d: _version(d) for d in ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime")
                },
                "attn_implementation": getattr(model.config, "_attn_implementation", None),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
