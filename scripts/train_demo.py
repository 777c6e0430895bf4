#!/usr/bin/env python
"""Train the demo ViT shipped in vitdeploy/demo/ on scikit-learn's bundled handwritten digits.

    .venv/bin/python scripts/train_demo.py                 # train, save, write images + card
    .venv/bin/python scripts/train_demo.py --card-only     # re-measure the saved model, rewrite card

Deterministic on CPU: fixed seeds for torch / numpy / the augmentation RNG, a fixed thread
count (``--threads``, default 2) and ``torch.use_deterministic_algorithms(True)``. Rerunning
with the same torch build, thread count and CPU reproduces the same weights.

Every image the model sees goes through the serving path: an 8x8 digit is rendered with
``vitdeploy.demo.render_digit`` (dark ink on white paper, 64x64 RGB PIL image), optionally
augmented as a PIL image (small affine jitter, sometimes a JPEG round trip), then turned into a
(3, 32, 32) float32 tensor by ``vitdeploy.runtime.preprocess.Preprocessor`` with the model's
PreprocessSpec. Weights are written and read back with vitdeploy.model.checkpoints, and the
card's figures are measured on the saved files.

No network: the data set ships with scikit-learn.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch
import torch.nn.functional as F
from PIL import Image

from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.demo import DEMO_DIR, render_digit
from vitdeploy.model.vit import VisionTransformer, ViTConfig

log = logging.getLogger("train_demo")

NAME = "vit-demo-digits"
LABELS = [str(i) for i in range(10)]
SPEC = PreprocessSpec(style="hf", height=32, width=32, interpolation="bilinear", mean=(0.5,) * 3, std=(0.5,) * 3)
IMAGES_PER_CLASS = 4
JPEG_QUALITY = 90


# --------------------------------------------------------------------------- preprocessing


def make_preprocessor(spec: PreprocessSpec) -> tuple[Callable[[Any], np.ndarray], str]:
    from vitdeploy.runtime.preprocess import Preprocessor

    return Preprocessor(spec), "vitdeploy.runtime.preprocess.Preprocessor"


# --------------------------------------------------------------------------- data


def load_split(test_size: float, seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x, y = digits.images, digits.target.astype(np.int64)
    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=test_size, random_state=seed, stratify=y)
    return x, y, np.sort(tr), np.sort(te)


def augment(image: Image.Image, rng: random.Random) -> Image.Image:
    """Small random affine jitter (rotation, scale, shear, shift) on white paper; sometimes JPEG."""
    w, h = image.size
    angle = math.radians(rng.uniform(-12.0, 12.0))
    scale = rng.uniform(0.85, 1.15)
    shear = math.radians(rng.uniform(-8.0, 8.0))
    tx, ty = rng.uniform(-0.1, 0.1) * w, rng.uniform(-0.1, 0.1) * h
    # Forward map about the centre: A = R(angle) @ Shear @ S(scale); PIL wants the inverse.
    ca, sa, t = math.cos(angle), math.sin(angle), math.tan(shear)
    a = np.array([[ca, -sa], [sa, ca]]) @ np.array([[1.0, t], [0.0, 1.0]]) * scale
    inv = np.linalg.inv(a)
    cx, cy = w / 2.0, h / 2.0
    off = np.array([cx, cy]) - inv @ np.array([cx + tx, cy + ty])
    coeffs = (inv[0, 0], inv[0, 1], off[0], inv[1, 0], inv[1, 1], off[1])
    out = image.transform(
        (w, h), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR, fillcolor=(255, 255, 255)
    )
    if rng.random() < 0.3:
        buf = io.BytesIO()
        out.save(buf, format="JPEG", quality=rng.randint(70, 95))
        buf.seek(0)
        out = Image.open(buf).convert("RGB")
    return out


def to_batch(images: Sequence[Any], pre: Callable[[Any], np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack([pre(im) for im in images]))


# --------------------------------------------------------------------------- train / eval


def lr_at(step: int, total: int, warmup: int, base: float) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def accuracy(model: VisionTransformer, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    model.eval()
    preds = torch.cat([model(x[i : i + batch]).argmax(1) for i in range(0, len(x), batch)])
    return float((preds == y).float().mean())


def train(
    args: argparse.Namespace, cfg: ViTConfig, pre: Callable[[Any], np.ndarray]
) -> tuple[VisionTransformer, dict]:
    x, y, tr, te = load_split(args.test_size, args.seed)
    clean = [render_digit(im) for im in x]  # rendered once; augmentation works on copies
    x_te = to_batch([clean[i] for i in te], pre)
    y_te = torch.from_numpy(y[te])

    torch.manual_seed(args.seed)
    model = VisionTransformer(cfg)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos_embed" not in n and "cls_token" not in n]
    no_decay = [
        p for n, p in model.named_parameters() if not (p.ndim >= 2 and "pos_embed" not in n and "cls_token" not in n)
    ]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.999),
    )
    aug_rng = random.Random(args.seed)
    order_rng = np.random.RandomState(args.seed)
    steps_per_epoch = math.ceil(len(tr) / args.batch_size)
    total, warmup = steps_per_epoch * args.epochs, steps_per_epoch * args.warmup_epochs
    step, start = 0, time.perf_counter()
    fastest = math.inf
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        model.train()
        perm = tr[order_rng.permutation(len(tr))]
        running = 0.0
        for b in range(steps_per_epoch):
            ids = perm[b * args.batch_size : (b + 1) * args.batch_size]
            xb = to_batch([augment(clean[i], aug_rng) for i in ids], pre)
            yb = torch.from_numpy(y[ids])
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, warmup, args.lr)
            loss = F.cross_entropy(model(xb), yb, label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            running += float(loss.detach()) * len(ids)
            step += 1
        fastest = min(fastest, time.perf_counter() - epoch_start)
        if (epoch + 1) % args.log_every == 0 or epoch + 1 == args.epochs:
            acc = accuracy(model, x_te, y_te)
            log.info(
                "epoch %3d/%d  loss %.4f  held-out acc %.4f  (%.0fs)",
                epoch + 1,
                args.epochs,
                running / len(tr),
                acc,
                time.perf_counter() - start,
            )
    seconds = time.perf_counter() - start
    stats = {
        "train_seconds": seconds,
        "load": os.getloadavg()[0],
        "fastest_epoch": fastest,
        "heldout_acc": accuracy(model, x_te, y_te),
        "n_train": len(tr),
        "n_heldout": len(te),
    }
    return model, stats


# --------------------------------------------------------------------------- saving


def _umask_mode() -> int:
    """0o644 under the usual umask: mkstemp and safetensors create files 0o600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_model(model: VisionTransformer, out: Path) -> str:
    """model.safetensors + model.json through the project's own writer (atomic)."""
    from vitdeploy.model.checkpoints import save_checkpoint

    save_checkpoint(out, model, labels=LABELS, preprocess=SPEC, name=NAME)
    for written in ("model.safetensors", "model.json"):  # safetensors creates files 0o600
        os.chmod(out / written, _umask_mode())
    return "vitdeploy.model.checkpoints.save_checkpoint"


def load_model(out: Path) -> tuple[VisionTransformer, str]:
    """The saved model read back through the project's own reader, checked against what was saved."""
    from vitdeploy.model.checkpoints import load_checkpoint

    loaded = load_checkpoint(out)
    if loaded.source_format != "vitdeploy" or loaded.preprocess != SPEC or list(loaded.labels) != LABELS:
        raise SystemExit(f"{out}: read back as {loaded.source_format} with {loaded.preprocess} / {loaded.labels}")
    return loaded.model.eval(), "vitdeploy.model.checkpoints.load_checkpoint"


def write_images(out: Path, seed: int, test_size: float) -> list[tuple[str, str]]:
    """4 held-out digits per class, alternately PNG and JPEG, 64x64; plus images/labels.csv."""
    x, y, _, te = load_split(test_size, seed)
    rng = np.random.RandomState(seed + 1)
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    for old in images.glob("digit*_*.*"):
        old.unlink()
    rows = []
    for label in range(10):
        pool = te[y[te] == label]
        for k, i in enumerate(sorted(rng.choice(pool, IMAGES_PER_CLASS, replace=False))):
            ext = "png" if k % 2 == 0 else "jpg"
            name = f"digit{label}_{i:04d}.{ext}"
            buf = io.BytesIO()
            if ext == "png":
                render_digit(x[i]).save(buf, format="PNG", optimize=True)
            else:
                render_digit(x[i]).save(buf, format="JPEG", quality=JPEG_QUALITY)
            _atomic_write_bytes(images / name, buf.getvalue())
            rows.append((name, str(label)))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path", "label"])
    writer.writerows(rows)
    _atomic_write_bytes(images / "labels.csv", text.getvalue().encode())
    return rows


# --------------------------------------------------------------------------- measuring + card


def measure(out: Path, args: argparse.Namespace) -> dict:
    """Accuracy of the *saved* model: shipped image files and the full held-out split."""
    model, loader = load_model(out)
    pre, pre_name = make_preprocessor(SPEC)
    with open(out / "images" / "labels.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    x_img = torch.from_numpy(np.stack([pre(str(out / "images" / r["path"])) for r in rows]))
    y_img = torch.tensor([LABELS.index(r["label"]) for r in rows])
    x, y, _, te = load_split(args.test_size, args.seed)

    # The full held-out split, each digit written to PNG bytes and read back as a file would be.
    def as_png(i: int) -> Image.Image:
        buf = io.BytesIO()
        render_digit(x[i]).save(buf, format="PNG")
        buf.seek(0)
        return Image.open(buf)

    x_te = to_batch([as_png(i) for i in te], pre)
    y_te = torch.from_numpy(y[te])
    return {
        "images_acc": accuracy(model, x_img, y_img),
        "images_n": len(rows),
        "images_correct": round(accuracy(model, x_img, y_img) * len(rows)),
        "heldout_acc_saved": accuracy(model, x_te, y_te),
        "n_heldout": len(te),
        "heldout_correct": round(accuracy(model, x_te, y_te) * len(te)),
        "loader": loader,
        "preprocessor": pre_name,
        "params": sum(p.numel() for p in model.parameters()),
        "weights_bytes": (out / "model.safetensors").stat().st_size,
        "cfg": model.cfg,
        "weights_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
    }


CARD = """# Model card: {name}

A small Vision Transformer trained on scikit-learn's bundled handwritten digits. It ships
inside vitdeploy so export, validation and every runtime backend can be run end to end with
no checkpoint of your own and no network. **Intended use: demos and tests only.** It knows
nothing but centred 8x8 digits rendered as below; it is not a handwriting recogniser.

## Architecture

`vitdeploy.model.vit.VisionTransformer` with

```json
{cfg_json}
```

{grid}x{grid} = {tokens} patch tokens of {patch}x{patch} pixels plus a class token;
{params:,} parameters; `model.safetensors` is {weights_bytes:,} bytes (float32), sha256
`{weights_sha256}`.
Labels: `"0"` .. `"9"` (index = digit).

## Input and preprocessing

An 8x8 digit (ink counts 0..16) is rendered by `vitdeploy.demo.render_digit`: **dark ink on
white paper** (0 -> 255, 16 -> 0, linear, rounded to uint8), upscaled to 64x64 with Pillow's
bilinear filter, converted to RGB. The model's preprocessing (in `model.json`) then resizes
to 32x32 and normalises:

```json
{spec_json}
```

i.e. Pillow bilinear resize to 32x32, scale to [0, 1], `(x - 0.5) / 0.5` per channel.
Training fed every image through this same path (PIL image -> `Preprocessor`).

## Data and split

`sklearn.datasets.load_digits()`: 1797 images, 10 classes. Stratified split with
`train_test_split(test_size={test_size}, random_state={seed}, stratify=y)`: {n_train} training
images, {n_heldout} held out. Nothing held out was trained on; the final weights are those of
the last epoch (no early stopping, no checkpoint picking). There is no separate validation set:
the recipe's sizes and epoch count were settled after a short trial run that printed held-out
accuracy, so treat the figure below as a demo number, not a benchmark. The split is per image,
not per writer, so the same writers appear on both sides.

## Training recipe

- {epochs} epochs, batch {batch_size}, AdamW (lr {lr}, betas 0.9/0.999, weight decay
  {weight_decay} on matrices, none on biases, norms, class token and position table),
  {warmup_epochs} warm-up epochs then cosine decay to 0, gradient-norm clip 1.0,
  cross-entropy with label smoothing {label_smoothing}.
- Augmentation on the 64x64 PIL image: random affine (rotation +-12 deg, scale 0.85-1.15,
  shear +-8 deg, shift +-10%) on white paper, and a JPEG round trip (quality 70-95) with
  probability 0.3. No mixup.
- Deterministic: seed {seed} for torch, numpy and the augmentation RNG,
  `torch.use_deterministic_algorithms(True)`, {threads} CPU threads.
- Trained in {train_seconds:.0f} s wall clock on {threads} CPU threads (torch
  {torch_version}){load_note}.

Command:

```
{command}
```

## Results

Measured on the **saved files** (weights loaded with {loader}; pixels through
{preprocessor}):

| set | images | correct | top-1 accuracy |
|---|---|---|---|
| full held-out split (rendered, PNG round trip) | {n_heldout} | {heldout_correct} | {heldout_pct:.2f}% |
| shipped `images/` (PNG + JPEG q{jpeg_quality}, 64x64) | {images_n} | {images_correct} | {images_pct:.2f}% |

Held-out top-1 accuracy: **{heldout_acc:.4f}**
Shipped-images top-1 accuracy: **{images_acc:.4f}**

## Shipped images

`images/` holds {per_class} held-out digits per class (alternately PNG and JPEG quality
{jpeg_quality}), 64x64 RGB, named `digit<label>_<index into load_digits>.<ext>`;
`images/labels.csv` lists `path,label` with paths relative to `images/`.

## Limitations

Trained on {n_train} tiny, centred, size-normalised digits (the UCI optdigits data as bundled
with scikit-learn). Expect poor results on photos, other stroke widths, white-on-black images or
off-centre digits. Do not use for anything but demonstrating and testing vitdeploy.
"""


def write_card(
    out: Path, args: argparse.Namespace, m: dict, train_seconds: float, load: float | None, fastest_epoch: float | None
) -> None:
    cfg: ViTConfig = m["cfg"]
    load_note = (
        ""
        if load is None
        else (
            f"; the 1-minute load average was {load:.1f} when training ended "
            f"({os.cpu_count()} cores: above ~2, other work shared the CPU and the time is inflated)"
        )
    )
    if fastest_epoch is not None:
        load_note += (
            f". The fastest epochs took about {fastest_epoch:.1f} s each, i.e. about "
            f"{fastest_epoch * args.epochs / 60:.0f} min for all {args.epochs} on an idle machine"
        )
    text = CARD.format(
        name=NAME,
        cfg_json=json.dumps(cfg.to_dict(), indent=2),
        grid=cfg.grid,
        tokens=cfg.num_patches,
        patch=cfg.patch_size,
        params=m["params"],
        weights_bytes=m["weights_bytes"],
        weights_sha256=m["weights_sha256"],
        spec_json=json.dumps(SPEC.to_dict(), indent=2),
        test_size=args.test_size,
        seed=args.seed,
        n_train=1797 - m["n_heldout"],
        n_heldout=m["n_heldout"],
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_epochs=args.warmup_epochs,
        label_smoothing=args.label_smoothing,
        threads=args.threads,
        train_seconds=train_seconds,
        load_note=load_note,
        torch_version=torch.__version__,
        command=args.command,
        loader=m["loader"],
        preprocessor=m["preprocessor"],
        heldout_correct=m["heldout_correct"],
        heldout_pct=100 * m["heldout_acc_saved"],
        images_n=m["images_n"],
        images_correct=m["images_correct"],
        images_pct=100 * m["images_acc"],
        heldout_acc=m["heldout_acc_saved"],
        images_acc=m["images_acc"],
        jpeg_quality=JPEG_QUALITY,
        per_class=IMAGES_PER_CLASS,
    )
    _atomic_write_bytes(out / "MODEL_CARD.md", text.encode())


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEMO_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--test-size", type=float, default=0.2)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--warmup-epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mlp-ratio", type=float, default=2.0)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--no-save", action="store_true", help="train and report only; write nothing")
    p.add_argument(
        "--card-only",
        action="store_true",
        help="skip training: re-measure the saved model and images, rewrite MODEL_CARD.md "
        "(--train-seconds gives the training time to state)",
    )
    p.add_argument("--train-seconds", type=float, default=None)
    p.add_argument(
        "--train-load",
        type=float,
        default=None,
        help="with --card-only: the 1-minute load average when training finished",
    )
    p.add_argument(
        "--fastest-epoch", type=float, default=None, help="with --card-only: seconds of the fastest training epoch"
    )
    args = p.parse_args(argv)
    # The training command, for the card: this invocation without the card-only options.
    given, kept = list(argv if argv is not None else sys.argv[1:]), []
    skip = False
    for a in given:
        if skip:
            skip = False
        elif a in ("--train-seconds", "--train-load", "--fastest-epoch"):
            skip = True
        elif a != "--card-only" and not a.startswith(("--train-seconds=", "--train-load=", "--fastest-epoch=")):
            kept.append(a)
    args.command = " ".join([".venv/bin/python scripts/train_demo.py", *kept])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    out: Path = args.out
    if args.card_only:
        if args.train_seconds is None:
            raise SystemExit("--card-only needs --train-seconds (the time the training run took)")
        m = measure(out, args)
        write_card(out, args, m, args.train_seconds, args.train_load, args.fastest_epoch)
        log.info("card rewritten: held-out %.4f, images %.4f", m["heldout_acc_saved"], m["images_acc"])
        return 0

    cfg = ViTConfig(
        image_size=SPEC.height,
        patch_size=args.patch_size,
        in_channels=3,
        width=args.width,
        depth=args.depth,
        heads=args.heads,
        mlp_ratio=args.mlp_ratio,
        num_classes=len(LABELS),
    )
    pre, pre_name = make_preprocessor(SPEC)
    log.info("config %s; preprocessing via %s", cfg.to_dict(), pre_name)
    model, stats = train(args, cfg, pre)
    log.info(
        "trained in %.0fs: held-out accuracy %.4f (%d images)",
        stats["train_seconds"],
        stats["heldout_acc"],
        stats["n_heldout"],
    )
    if args.no_save:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    writer = save_model(model.eval(), out)
    write_images(out, args.seed, args.test_size)
    m = measure(out, args)
    write_card(out, args, m, stats["train_seconds"], stats["load"], stats["fastest_epoch"])
    log.info(
        "saved via %s; measured on saved files (%s, %s): held-out %.4f, shipped images %d/%d",
        writer,
        m["loader"],
        m["preprocessor"],
        m["heldout_acc_saved"],
        m["images_correct"],
        m["images_n"],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
