"""What the Predictor adds over a bare ONNX Runtime call, on an already-preprocessed batch.

Target: ``Predictor.predict_logits(batch)`` on a float32 (8, 3, H, W) batch costs at most 5%
more than ``session.run`` on the very same ``onnxruntime.InferenceSession`` (the one inside
the Predictor's "ort" backend). Measured side by side, interleaved: every round calls each
variant (a fixed number of times) in an order that rotates from round to round; the overhead
is taken per round against the bare call of that round, and the median over rounds is reported
with its spread. ``--repeats`` runs the whole measurement again.

Variants, all on the same session and the same batch object:

* ``session.run``          the raw onnxruntime call (the floor);
* ``backend.run``          vitdeploy's backend (input checks, batch splitting, float32 out);
* ``predict_logits``       the Predictor's logits call (the target);
* ``predict (4-D batch)``  the Predictor's end-to-end call on a preprocessed batch: also does
                           softmax, top-5 and builds ``Prediction`` objects, work the raw call
                           does not do, so it is informational.

Models: (a) the demo model's artifacts (a tiny ViT: the fixed Python cost is then a visible
fraction of a sub-millisecond call), (b) a ViT-S/16 at 224 with random weights, exported with
vitdeploy's own export pipeline into a cache folder on first use.

    .venv/bin/python benchmarks/bench_predictor_overhead.py                        # demo + ViT-S/16
    .venv/bin/python benchmarks/bench_predictor_overhead.py --artifacts /tmp/bench_demo_art
    .venv/bin/python benchmarks/bench_predictor_overhead.py --variant vit_base_patch16_224 --threads 2
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vitdeploy.base.machine import cpu_model  # noqa: E402

TARGET = 0.05
BATCH = 8
DEFAULT_CACHE = Path(os.environ.get("VITDEPLOY_BENCH_CACHE", "/tmp/vitdeploy-bench"))


# ---------------------------------------------------------------------------------------------
# environment


def print_environment(threads: list[int | None]) -> None:
    import onnxruntime as ort

    print("== environment")
    print(f"cpu          : {cpu_model()} ({os.cpu_count()} logical CPUs, affinity {sorted(os.sched_getaffinity(0))})")
    print(
        f"python       : {platform.python_version()}; numpy {np.__version__}; onnxruntime {ort.__version__} "
        f"({', '.join(ort.get_available_providers())})"
    )
    print(
        f"ort threads  : {', '.join('default' if t is None else str(t) for t in threads)} "
        f"(intra-op; BackendOptions.threads)"
    )


# ---------------------------------------------------------------------------------------------
# artifacts


def demo_artifacts(out: Path, wait_s: float) -> Path | None:
    """The demo model exported (no TensorRT) into ``out``, once ``vitdeploy/demo/model.json`` exists."""
    if (out / "manifest.json").is_file():
        return out
    from vitdeploy.demo import DEMO_DIR as DEMO_MODEL_DIR

    deadline = time.monotonic() + wait_s
    while not (DEMO_MODEL_DIR / "model.json").is_file():
        if time.monotonic() >= deadline:
            print(f"demo model not found ({DEMO_MODEL_DIR / 'model.json'}): skipping the demo artifacts")
            return None
        time.sleep(10)
    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    print(f"exporting the demo model into {out} (vitdeploy export -o {out} --engine skip) ...")
    run_export(parse_config({}), out, engine="skip")
    return out


def random_vit_artifacts(variant: str, cache: Path) -> Path:
    """A ``variant`` ViT with random weights, exported by vitdeploy's pipeline (FP32 ONNX only)."""
    out = cache / f"{variant}-random"
    if (out / "manifest.json").is_file():
        return out
    import torch

    from vitdeploy.base.config import parse_config
    from vitdeploy.base.preprocess_spec import PreprocessSpec
    from vitdeploy.export.pipeline import run_export
    from vitdeploy.model.checkpoints import save_checkpoint
    from vitdeploy.model.vit import VARIANTS, VisionTransformer

    torch.manual_seed(0)
    cfg = VARIANTS[variant]
    model = VisionTransformer(cfg).eval()
    ckpt = cache / f"{variant}-random-checkpoint"
    save_checkpoint(
        ckpt,
        model,
        [f"class_{i}" for i in range(cfg.num_classes)],
        PreprocessSpec(style="hf", height=cfg.image_size, width=cfg.image_size),
        f"{variant}-random",
    )
    config = parse_config(
        {
            "model": {"checkpoint": str(ckpt)},
            "export": {"fp16": {"enabled": False}},
            "validation": {"max_images": 8, "noise_samples": 8},
        }
    )
    print(f"exporting {variant} (random weights) into {out} ...")
    start = time.perf_counter()
    run_export(config, out, engine="skip", validation_batch=(1, BATCH))
    print(f"  done in {time.perf_counter() - start:.0f} s")
    return out


# ---------------------------------------------------------------------------------------------
# timing


def timed_rounds(fns: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, list[float]]:
    """Seconds per call of each function, one value (the mean of ``calls`` calls) per round.

    Interleaved call by call: each of the ``calls`` steps of a round calls every function once,
    in an order that rotates from round to round, so load from other processes falls on all
    variants alike and the per-round ratios pair calls made moments apart.
    """
    names = list(fns)
    for fn in fns.values():  # warm-up
        fn()
    per: dict[str, list[float]] = {n: [] for n in names}
    clock = time.perf_counter
    for r in range(rounds):
        k = r % len(names)
        order = names[k:] + names[:k]
        if (r // len(names)) % 2:
            order.reverse()
        total = dict.fromkeys(names, 0.0)
        for _ in range(calls):
            for name in order:
                fn = fns[name]
                start = clock()
                fn()
                total[name] += clock() - start
        for name in names:
            per[name].append(total[name] / calls)
    return per


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 4:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def bench_one(
    label: str, directory: Path, threads: int | None, rounds: int, heavy_rounds: int, budget_s: float
) -> dict[str, float]:
    from vitdeploy.runtime.backends.base import BackendOptions
    from vitdeploy.runtime.predictor import Predictor

    predictor = Predictor.from_artifacts(directory, backend="ort", options=BackendOptions(threads=threads))
    backend = predictor.backend
    session = backend._session  # the very InferenceSession the Predictor uses
    in_name, out_name = backend.input_name, backend.output_name
    c, h, w = predictor.input_shape
    batch = np.random.default_rng(0).standard_normal((BATCH, c, h, w)).astype(np.float32)

    raw = session.run([out_name], {in_name: batch})[0]
    np.testing.assert_allclose(predictor.predict_logits(batch), raw, rtol=1e-5, atol=1e-5)  # same computation
    assert len(predictor.predict(batch)) == BATCH

    fns = {
        "session.run (bare)": lambda: session.run([out_name], {in_name: batch}),
        "backend.run": lambda: backend.run(batch),
        "predict_logits": lambda: predictor.predict_logits(batch),
        "predict (4-D batch, + softmax/top-5)": lambda: predictor.predict(batch),
    }
    start = time.perf_counter()
    session.run([out_name], {in_name: batch})
    one = time.perf_counter() - start
    # Enough calls per variant per round that a round of one variant lasts ~budget_s; a model
    # slower than 0.1 s a call gets one call per round and ``heavy_rounds`` rounds.
    calls = max(1, int(budget_s / max(one, 1e-6)))
    if one > 0.1:
        rounds = heavy_rounds
    per = timed_rounds(fns, rounds, calls)
    base = per["session.run (bare)"]
    print(f"\n{label}: {directory}")
    print(f"  {predictor.describe()}; input {BATCH}x{c}x{h}x{w} float32; {rounds} rounds x {calls} calls")
    print(
        f"  {'variant':40s} {'ms/call (median)':>17s} {'overhead vs bare (median, IQR)':>32s} {'added us':>9s}  target"
    )
    result = {"bare_s": statistics.median(base)}
    for name, secs in per.items():
        ms = statistics.median(secs) * 1e3
        line = f"  {name:40s} {ms:17.3f}"
        if name != "session.run (bare)":
            rel = [s / b - 1.0 for s, b in zip(secs, base)]
            med, (lo, hi) = statistics.median(rel), quartiles(rel)
            added = statistics.median([(s - b) * 1e6 for s, b in zip(secs, base)])
            result[name] = med
            verdict = (
                ("PASS" if med <= TARGET else "FAIL") + f" vs {TARGET:.0%}" if name == "predict_logits" else "(info)"
            )
            line += f" {med:+11.2%} ({lo:+.2%} .. {hi:+.2%}) {added:9.1f}  {verdict}"
        print(line)
    predictor.close()
    return result


def fixed_cost_us(directory: Path) -> dict[str, float]:
    """The Python cost itself: each layer's time with the session replaced by a stub that
    returns a precomputed output (so only vitdeploy's code runs)."""
    from vitdeploy.runtime.predictor import Predictor

    predictor = Predictor.from_artifacts(directory, backend="ort")
    backend = predictor.backend
    c, h, w = predictor.input_shape
    batch = np.zeros((BATCH, c, h, w), np.float32)
    out = backend._session.run([backend.output_name], {backend.input_name: batch})

    class Stub:
        def run(self, names, feed):
            return out

    backend._session = Stub()
    stub = Stub()
    fns = {
        "stub session.run": lambda: stub.run([backend.output_name], {backend.input_name: batch}),
        "backend.run": lambda: backend.run(batch),
        "predict_logits": lambda: predictor.predict_logits(batch),
        "predict (4-D batch)": lambda: predictor.predict(batch),
    }
    per = timed_rounds(fns, 15, 2000)
    return {k: statistics.median(v) * 1e6 for k, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--artifacts",
        type=Path,
        action="append",
        default=[],
        help="an export directory to measure (repeatable); default: the demo export and a random ViT-S/16",
    )
    ap.add_argument(
        "--demo-dir",
        type=Path,
        default=Path("/tmp/bench_demo_art"),
        help="where the demo model is (or gets) exported (default /tmp/bench_demo_art)",
    )
    ap.add_argument("--wait-demo", type=float, default=0.0, help="seconds to wait for vitdeploy/demo/model.json")
    ap.add_argument("--variant", default="vit_small_patch16_224", help="random-weight ViT to export and measure")
    ap.add_argument("--no-variant", action="store_true", help="skip the random-weight ViT")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"export cache (default {DEFAULT_CACHE})")
    ap.add_argument(
        "--threads", default="1,2", help="ONNX Runtime intra-op threads to try, comma-separated; 0 = default"
    )
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    ap.add_argument(
        "--heavy-rounds", type=int, default=10, help="rounds for a model slower than 0.1 s a call (default 10)"
    )
    ap.add_argument("--repeats", type=int, default=2, help="independent repeats (default 2)")
    ap.add_argument(
        "--budget", type=float, default=0.2, help="seconds per variant per round for fast models (default 0.2)"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    threads = [None if t.strip() in ("0", "") else int(t) for t in args.threads.split(",")]
    print_environment(threads)
    targets: list[tuple[str, Path]] = [(f"artifacts {p.name}", p) for p in args.artifacts]
    if not args.artifacts:
        demo = demo_artifacts(args.demo_dir, args.wait_demo)
        if demo is not None:
            targets.append(("(a) demo model", demo))
        if not args.no_variant:
            targets.append((f"(b) {args.variant}, random weights", random_vit_artifacts(args.variant, args.cache)))

    summary: dict[tuple[str, str], list[float]] = {}
    bare: dict[str, list[float]] = {}
    fixed: dict[str, dict[str, float]] = {}
    for label, directory in targets:
        fixed[label] = costs = fixed_cost_us(directory)
        print(
            f"\n{label}: vitdeploy's own cost per call with a stub session (us): "
            + ", ".join(f"{k} {v:.1f}" for k, v in costs.items())
        )
    from _common import contention_since

    from vitdeploy.evaluate.reliability import sample

    before = sample()
    for rep in range(args.repeats):
        print(f"\n== repeat {rep + 1}/{args.repeats}")
        for label, directory in targets:
            for t in threads:
                name = f"{label}, threads={'default' if t is None else t}"
                res = bench_one(name, directory, t, args.rounds, args.heavy_rounds, args.budget)
                summary.setdefault((name, "predict_logits"), []).append(res["predict_logits"])
                summary.setdefault((name, "predict"), []).append(res["predict (4-D batch, + softmax/top-5)"])
                bare.setdefault(f"{label}|{'default' if t is None else t}", []).append(res["bare_s"])

    print(f"\n== while timed: {contention_since(before)}")
    print("\n== summary (median overhead over the bare session.run, per repeat)")
    for (name, what), vals in summary.items():
        verdict = (
            ("PASS" if max(vals) <= TARGET else "FAIL") + f" vs {TARGET:.0%}" if what == "predict_logits" else "(info)"
        )
        print(
            f"{name:52s} {what:15s} {', '.join(f'{v:+.2%}' for v in vals)}  spread {max(vals) - min(vals):.2%}  "
            f"{verdict}"
        )
    print("\n== the same from the fixed cost (stub session; free of the machine's noise): cost / bare call")
    for key, secs in bare.items():
        label, t = key.split("|")
        b_us = statistics.median(secs) * 1e6
        parts = []
        for what in ("backend.run", "predict_logits", "predict (4-D batch)"):
            extra = fixed[label][what] - fixed[label]["stub session.run"]
            parts.append(f"{what} +{extra:.1f} us = {extra / b_us:.4%}")
        print(f"{label}, threads={t}: bare call {b_us / 1e3:.3f} ms; " + "; ".join(parts))


if __name__ == "__main__":
    main()
