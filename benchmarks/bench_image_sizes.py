"""What an export for several sizes costs at its base size: the dynamic-size graph against a fixed-size graph of
the same weights, and how close each size stays to eager PyTorch.

One checkpoint, a DINOv2-S/14 with 4 registers (transformers' ``Dinov2WithRegistersModel``, random weights, seed
0; config image_size 518, the hub processor's 224 px crop: base size 224), exported twice with `vitdeploy export`
(``--engine skip``; FP16 and INT8 off, a short validation: the graphs compared are model.ort.onnx):

* ``dynamic``: ``export.image_sizes: [224, 336, 448, 518]``: height and width dynamic, the position table
  resampled in the graph (bicubic, as transformers does), each size validated against eager at that size;
* ``fixed``: the same checkpoint at 224 only (the table resampled once, at load).

Both run on vitdeploy's ``ort`` backend (OrtBackend, model.ort.onnx, ``--threads`` intra-op threads) at 224 px,
batch 1 and 8, timed in interleaved rounds (each round calls every graph once, in a fresh random order), repeated.
Printed per batch: each graph's median and p90, the median of the per-round ratio dynamic / fixed with its p10-p90
spread, the load average before and after and what other processes took of the CPU; then each size's FP32
max|diff| and cosine against eager from the dynamic export's manifest (``validation.<gate>.per_size``). The two
graphs' answers at 224 are compared too (they are the same model).

    .venv/bin/python benchmarks/bench_image_sizes.py                       # ~4 min on 2 cores (exports ~3 of them)
    .venv/bin/python benchmarks/bench_image_sizes.py --keep /tmp/bsz       # keep the exports; a rerun reuses them
    .venv/bin/python benchmarks/bench_image_sizes.py --rounds 40 --repeat 3 --threads 2
    .venv/bin/python benchmarks/bench_image_sizes.py --smoke   # a tiny DINOv2 at 28/42/56/70 px: the script works
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from _common import contention_since, interleaved  # noqa: E402
from bench_embedding import dinov2_small_registers  # noqa: E402

from vitdeploy.base.machine import describe_cpu  # noqa: E402
from vitdeploy.evaluate.reliability import sample  # noqa: E402

SIZES = [224, 336, 448, 518]
SMOKE_SIZES = [28, 42, 56, 70]  # --smoke: tests/helpers' tiny DINOv2 with registers (base 56)
BATCHES = (1, 8)
#: a short export: the FP32 graphs only, validated on 12 images and 4 noise inputs at batch 1 and 8
EXPORT = {"batch": {"min": 1, "opt": 8, "max": 8}, "fp16": {"enabled": False}, "int8": {"enabled": False}}
VALIDATION = {"max_images": 12, "noise_samples": 4}


def export(checkpoint: Path, out: Path, image_sizes: list[int] | None) -> float:
    """`vitdeploy export` of ``checkpoint`` into ``out`` in a subprocess (this process stays quiet for the timing);
    its seconds, 0 when ``out`` already holds an export (--keep)."""
    if (out / "manifest.json").is_file():
        return 0.0
    config = out.parent / f"{out.name}.yaml"
    export_section = {**EXPORT, **({"image_sizes": image_sizes} if image_sizes else {})}
    doc = {"model": {"checkpoint": str(checkpoint)}, "export": export_section, "validation": VALIDATION}
    config.write_text(json.dumps(doc))
    cli = [sys.executable, "-m", "vitdeploy.cli", "export", "-c", str(config), "-o", str(out), "--engine", "skip"]
    start = time.perf_counter()
    proc = subprocess.run(cli, capture_output=True, text=True, cwd=REPO)
    if not (out / "manifest.json").is_file():
        raise SystemExit(f"export failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def accuracy_per_size(manifest: dict) -> list[tuple[int, str, dict, bool]]:
    """(size, gate, metrics, passed) of each FP32 gate at each size, from the manifest's validations."""
    base = manifest["io"]["input"]["shape"][-1]
    rows = []
    for gate in ("validate-onnx", "validate-ort-optimized"):
        judged = manifest["validation"].get(gate)
        if not judged:
            continue
        sizes = {base: judged, **{int(k): v for k, v in (judged.get("per_size") or {}).items()}}
        rows += [(size, gate, v.get("metrics", {}), bool(v.get("passed"))) for size, v in sorted(sizes.items())]
    return rows


def open_ort(folder: Path, threads: int):
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import BackendOptions, open_backend

    return open_backend("ort", Artifacts.open(folder), BackendOptions(threads=threads))


def spread(values: list[float]) -> str:
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return f"{p50:.3f} (p10 {p10:.3f}, p90 {p90:.3f})"


def time_batch(graphs: dict, batch: int, side: int, args: argparse.Namespace, seed: int) -> tuple[dict, list[float]]:
    """Interleaved rounds at ``batch`` and ``side`` px: ({graph: (median ms, p90 ms)}, per-round ratios dynamic /
    fixed)."""
    x = np.random.default_rng(batch).standard_normal((batch, 3, side, side)).astype(np.float32)
    fns = {name: (lambda b=backend: b.run(x)) for name, backend in graphs.items()}
    t = interleaved(fns, warmup=args.warmup, iters=args.rounds, seed=seed)
    ratios = [d / f for d, f in zip(t.samples_ms["dynamic"], t.samples_ms["fixed"])]
    return {name: (t.median(name), t.p90(name)) for name in graphs}, ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it; a rerun reuses its exports")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of both graphs (default 2)")
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per repeat and batch (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    ap.add_argument("--repeat", type=int, default=2, help="repeats of the interleaved timing (default 2)")
    ap.add_argument("--smoke", action="store_true", help="a tiny DINOv2 instead (seconds): checks the script")
    args = ap.parse_args()
    print(f"machine: {describe_cpu()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ckpt = work / ("tiny-dinov2-reg" if args.smoke else "dinov2-s14-reg")
        if not (ckpt / "config.json").is_file():
            tiny_dinov2(ckpt) if args.smoke else dinov2_small_registers(ckpt)
        sizes = SMOKE_SIZES if args.smoke else SIZES
        seconds = {"dynamic": export(ckpt, work / "dynamic", sizes), "fixed": export(ckpt, work / "fixed", None)}
        print("exports: " + ", ".join(f"{k} {v:.0f} s" if v else f"{k} reused" for k, v in seconds.items()))
        run(work, args)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


def tiny_dinov2(folder: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from helpers.tiny_export import save_headless_dinov2

    save_headless_dinov2(folder)


def run(work: Path, args: argparse.Namespace) -> None:
    graphs = {name: open_ort(work / name, args.threads) for name in ("dynamic", "fixed")}
    side = graphs["fixed"].input_shape[1]  # the base size: the fixed graph's one size
    try:
        x = np.random.default_rng(0).standard_normal((2, 3, side, side)).astype(np.float32)
        same = float(np.abs(graphs["dynamic"].run(x) - graphs["fixed"].run(x)).max())
        print(f"the two graphs at {side} px: max|diff| {same:.3g} between their answers (same weights)")
        print(f"\nort backend, {args.threads} thread(s), {side} px; {args.rounds} rounds x {args.repeat} repeat(s)")
        print(f"{'batch':>5} {'rep':>3} {'dynamic p50/p90 ms':>20} {'fixed p50/p90 ms':>18}  ratio dynamic/fixed")
        for batch in BATCHES:
            for rep in range(args.repeat):
                before, load = sample(), os.getloadavg()[0]
                ms, ratios = time_batch(graphs, batch, side, args, seed=rep)
                d, f = ms["dynamic"], ms["fixed"]
                print(
                    f"{batch:>5} {rep + 1:>3} {d[0]:>9.2f}/{d[1]:<9.2f} {f[0]:>8.2f}/{f[1]:<9.2f}  {spread(ratios)}; "
                    f"load {load:.2f}; {contention_since(before)}"
                )
    finally:
        for backend in graphs.values():
            backend.close()
    manifest = json.loads((work / "dynamic" / "manifest.json").read_text())
    print("\neach size against eager PyTorch (FP32; the dynamic export's manifest)")
    print(f"{'size':>5} {'gate':<24} {'max|diff|':>10} {'cosine min':>12}  verdict")
    for size, gate, m, passed in accuracy_per_size(manifest):
        cosine = m.get("cosine", float("nan"))
        print(
            f"{size:>5} {gate:<24} {m.get('max_abs_diff', float('nan')):>10.3g} {cosine:>12.8f}  "
            + ("pass" if passed else "FAIL")
        )


if __name__ == "__main__":
    main()
