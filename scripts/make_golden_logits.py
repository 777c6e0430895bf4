#!/usr/bin/env python
"""Regenerate tests/data/golden/demo_logits.npz: fixed demo images, their preprocessed inputs and
the eager FP32 PyTorch logits of the shipped demo weights, with the library versions used.

    .venv/bin/python scripts/make_golden_logits.py            # rewrite the golden file
    .venv/bin/python scripts/make_golden_logits.py --check    # compare only; exit 1 if numbers moved

tests/model/test_vit_golden.py asserts that today's preprocessing reproduces the stored inputs
(max abs diff <= 1e-6) and today's eager model the stored logits (<= 1e-4), so an upgrade of
torch, Pillow or numpy that moves the numbers fails loudly. Regenerate only after reviewing why
they moved (and say so in the commit message).

The file holds: paths (relative to vitdeploy/demo/images, POSIX), labels (true labels), inputs
(N, 3, H, W) float32, logits (N, K) float32, weights_sha256 (of vitdeploy/demo/model.safetensors)
and versions (JSON: python, numpy, pillow, torch, vitdeploy). CPU, FP32, 1 thread.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "tests" / "data" / "golden" / "demo_logits.npz"
DEFAULT_COUNT = 16


def pick_images(labels_csv: Path, count: int) -> list[tuple[str, str]]:
    """``count`` (path, label) rows of the demo labels.csv, evenly spaced over its sorted rows."""
    with open(labels_csv, newline="", encoding="utf-8") as fh:
        rows = sorted((row["path"], row["label"]) for row in csv.DictReader(fh))
    if len(rows) <= count:
        return rows
    picks = np.linspace(0, len(rows) - 1, count).round().astype(int)
    return [rows[i] for i in picks]


def versions() -> dict[str, str]:
    import PIL
    import torch

    import vitdeploy

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "torch": torch.__version__,
        "vitdeploy": vitdeploy.__version__,
    }


def compute(count: int = DEFAULT_COUNT) -> dict[str, np.ndarray]:
    """The golden arrays, computed now from the shipped demo model and images."""
    import torch

    from vitdeploy.base.preprocess_spec import PreprocessSpec
    from vitdeploy.demo import DEMO_DIR as DEMO_MODEL_DIR
    from vitdeploy.demo import IMAGES_DIR as DEMO_IMAGES_DIR
    from vitdeploy.demo import LABELS_CSV as DEMO_LABELS_CSV
    from vitdeploy.runtime.backends.torch_backend import TorchBackend
    from vitdeploy.runtime.preprocess import Preprocessor

    torch.set_num_threads(1)
    meta = json.loads((DEMO_MODEL_DIR / "model.json").read_text(encoding="utf-8"))
    spec = PreprocessSpec.from_dict(meta["preprocess"])
    vit = meta["vit"]
    rows = pick_images(DEMO_LABELS_CSV, count)
    inputs = Preprocessor(spec).batch([DEMO_IMAGES_DIR / p for p, _ in rows])
    backend = TorchBackend(DEMO_MODEL_DIR, (vit.get("in_channels", 3), vit["image_size"], vit["image_size"]))
    try:
        logits = backend.run(inputs)
    finally:
        backend.close()
    weights = hashlib.sha256((DEMO_MODEL_DIR / "model.safetensors").read_bytes()).hexdigest()
    return {
        "paths": np.array([p for p, _ in rows]),
        "labels": np.array([lab for _, lab in rows]),
        "inputs": inputs.astype(np.float32),
        "logits": logits.astype(np.float32),
        "weights_sha256": np.array(weights),
        "versions": np.array(json.dumps(versions(), sort_keys=True)),
    }


def save(arrays: dict[str, np.ndarray], path: Path) -> None:
    """Write the npz atomically (temp file in the same folder, then os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GOLDEN, help=f"output file (default: {GOLDEN.relative_to(ROOT)})")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help="number of demo images (default: 16)")
    parser.add_argument("--check", action="store_true", help="compare with the existing file instead of writing")
    args = parser.parse_args(argv)
    arrays = compute(args.count)
    if args.check:
        with np.load(args.out) as old:
            d_in = float(np.abs(old["inputs"] - arrays["inputs"]).max())
            d_lo = float(np.abs(old["logits"] - arrays["logits"]).max())
            print(f"inputs max abs diff {d_in:.3g}, logits max abs diff {d_lo:.3g}; stored with {old['versions']}")
        return 0 if d_in <= 1e-6 and d_lo <= 1e-4 else 1
    save(arrays, args.out)
    print(
        f"wrote {args.out}: {len(arrays['paths'])} images, inputs {arrays['inputs'].shape}, "
        f"logits {arrays['logits'].shape}, versions {arrays['versions']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
