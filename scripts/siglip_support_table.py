"""The SigLIP rows of docs/checkpoints.md's support table, generated from timm's own list of architectures.

Two steps, two environments (timm cannot be imported beside vitdeploy's CPU torch):

    .venv-ref/bin/python scripts/siglip_support_table.py build OUT   # timm: every '*siglip*' architecture
    .venv/bin/python scripts/siglip_support_table.py table OUT       # vitdeploy: load each, compare, print

``build`` makes each architecture timm registers under ``*siglip*`` with its real structure (class token or not,
pooling, activation, MLP ratio, registers ...) at a tiny width (64, 4 heads, one block: the structure is what
decides whether vitdeploy can run it), saves it as timm's hub folder (``save_for_hf`` with those model_args) and
records timm's own output (``model(x)``, num_classes=0) on a random input at the architecture's input size, or why
timm could not build it. ``table`` loads every folder with vitdeploy and prints one markdown row per architecture:
loads (the largest difference from timm's output) or the one-line refusal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TINY = {"embed_dim": 64, "num_heads": 4, "depth": 1}


def build(out: Path) -> None:
    import numpy as np
    import timm
    import torch
    from timm.models import save_for_hf

    rows = {}
    for arch in timm.list_models("*siglip*"):
        folder = out / arch
        try:
            torch.manual_seed(0)
            model = timm.create_model(arch, pretrained=False, num_classes=0, **TINY).eval()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn_like(p))
            side = model.pretrained_cfg["input_size"][-1]
            x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                y = model(x)
            save_for_hf(model, str(folder), model_args=TINY, safe_serialization=True)
            np.savez(folder / "reference.npz", x=x.numpy(), y=y.numpy())
            rows[arch] = {"built": True}
        except Exception as exc:  # noqa: BLE001 - a refusal by timm is a row too
            rows[arch] = {"built": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    (out / "archs.json").write_text(json.dumps({"timm": timm.__version__, "rows": rows}, indent=1))


def table(out: Path) -> None:
    import numpy as np
    import torch

    from vitdeploy.base.errors import VitDeployError
    from vitdeploy.model import load_checkpoint

    info = json.loads((out / "archs.json").read_text())
    print(f"| timm {info['timm']} architecture | vitdeploy |")
    print("|---|---|")
    for arch, row in info["rows"].items():
        if not row["built"]:
            print(f"| `{arch}` | not built by timm here: {row['why']} |")
            continue
        try:
            loaded = load_checkpoint(out / arch)
        except VitDeployError as exc:
            print(f"| `{arch}` | refused: {str(exc).split(': ', 1)[-1][:300]} |")
            continue
        ref = np.load(out / arch / "reference.npz")
        with torch.no_grad():
            y = loaded.model(torch.from_numpy(ref["x"])).numpy()
        diff = float(np.abs(y - ref["y"]).max())
        cfg = loaded.config
        what = f"pool {cfg.pool}, {cfg.act}" + (", off the patch grid" if cfg.drop_remainder else "")
        print(f"| `{arch}` | loads ({what}; max abs diff from timm {diff:.1e}) |")


if __name__ == "__main__":
    {"build": build, "table": table}[sys.argv[1]](Path(sys.argv[2]))
