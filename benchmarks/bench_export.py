"""What the default `vitdeploy export` costs: time and peak memory per stage, in the unit that compares
across machines (the export's own ``reference`` stage: eager PyTorch over the validation inputs).

A random-weight Hugging Face ViT checkpoint (``save_pretrained``: safetensors + config.json, built here
from the paper's configuration, no download) is exported with the defaults (``--engine skip``: no
TensorRT here) in a subprocess; its manifest's stage records give each stage's seconds and peak
resident memory (the kernel's high-water mark, reset at each stage's start). Printed: a row per stage,
the whole export in reference-stage units (goal for ViT-B/16: <= 12), each stage's peak against the
FP32 weights, and over what the export holds without a model (the libraries and what they keep, recorded
by the export; goal: <= 4x the weights over it), and what other processes took of the CPU while it ran.

With ``--optimum``, ``optimum-cli export onnx`` exports the same checkpoint in the same run, for the
record (it exports and does not validate); it lives in the bench venv bench_ort_speed.py builds
(``.venv-bench``), created here if missing.

    .venv/bin/python benchmarks/bench_export.py                 # ViT-B/16
    .venv/bin/python benchmarks/bench_export.py --model vit-l   # ViT-L/16 (1.2 GB of weights)
    .venv/bin/python benchmarks/bench_export.py --model vit-g   # DINOv2 ViT-g/14, SwiGLU, headless (4.5 GB)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import cpu_flags  # noqa: E402

from vitdeploy.base.machine import describe_cpu  # noqa: E402
from vitdeploy.base.memory import human  # noqa: E402

#: Dosovitskiy et al., Table 1; HF's defaults for the rest.
MODELS = {
    "vit-b": dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, patch_size=16
    ),
    "vit-l": dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, patch_size=16
    ),
    "vit-h": dict(
        hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, intermediate_size=5120, patch_size=14
    ),
}
#: DINOv2's ViT-g/14 (Oquab et al., 2023): SwiGLU MLP, 1.1 B parameters, headless (an embedding export), its
#: hub processor's 224 px crop (transformers' Dinov2Model; the position table resampled from 518 px)
GIANT = dict(
    hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, mlp_ratio=4, use_swiglu_ffn=True, patch_size=14
)
MODELS["vit-g"] = GIANT
REFERENCE_GOAL, MEMORY_GOAL = 12.0, 4.0


def make_checkpoint(name: str, folder: Path, seed: int = 0) -> int:
    """A random-weight ViTForImageClassification saved with save_pretrained; returns its FP32 weight bytes."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    if name == "vit-g":
        return _giant(folder)
    cfg = ViTConfig(**MODELS[name], image_size=224, num_labels=1000, hidden_act="gelu", qkv_bias=True)
    model = ViTForImageClassification(cfg).eval()
    model.save_pretrained(folder)
    return sum(p.numel() * 4 for p in model.parameters())


def save_dinov2_processor(folder: Path) -> None:
    """DINOv2's hub processor: bicubic resize of the short side to 256, 224 px centre crop, ImageNet mean/std."""
    from transformers import BitImageProcessor

    BitImageProcessor(
        size={"shortest_edge": 256},
        crop_size={"height": 224, "width": 224},
        resample=3,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(folder)


def _giant(folder: Path) -> int:
    """DINOv2 ViT-g/14 as the hub ships it (config image_size 518, processor crop 224), random weights."""
    from transformers import Dinov2Config, Dinov2Model

    model = Dinov2Model(Dinov2Config(**GIANT, image_size=518)).eval()
    model.save_pretrained(folder)
    save_dinov2_processor(folder)
    weights = sum(p.numel() * 4 for p in model.parameters())
    del model
    return weights


def run_export(checkpoint: Path, out: Path) -> tuple[float, list[dict], int | None]:
    """(wall seconds, the stage records, what the export held without the model) of one default export."""
    config = out.parent / "pipeline.yaml"
    config.write_text(json.dumps({"model": {"checkpoint": str(checkpoint)}}))  # YAML reads JSON; the defaults
    cli = [sys.executable, "-m", "vitdeploy.cli", "export", "-c", str(config), "-o", str(out), "--engine", "skip"]
    start = time.perf_counter()
    proc = subprocess.run(cli, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    sys.stderr.write(proc.stderr[-4000:] if proc.returncode else "")
    manifest = out / "manifest.json"
    report = out / "export-report.json"
    source = manifest if manifest.is_file() else report
    if not source.is_file():
        raise SystemExit(f"export failed (exit {proc.returncode}) and left no record")
    record = json.loads(source.read_text())
    memory = record.get("export", {}).get("memory") or record.get("memory") or {}
    return wall, record["stages"], memory.get("held_without_model_bytes")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_optimum(checkpoint: Path, out: Path) -> float | None:
    from bench_ort_speed import ensure_bench_venv

    py = ensure_bench_venv(HERE.parent / ".venv-bench")
    cli = py.with_name("optimum-cli")
    start = time.perf_counter()
    proc = subprocess.run(
        [str(cli), "export", "onnx", "--model", str(checkpoint), "--task", "image-classification", str(out)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        sys.stderr.write(proc.stderr[-3000:])
        return None
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="vit-b")
    ap.add_argument("--optimum", action="store_true", help="also time optimum-cli export onnx (bench venv)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-export-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        _bench(args, work)
    finally:  # a ViT-H checkpoint and its export are ~10 GB: never left behind unless --keep
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def _bench(args: argparse.Namespace, work: Path) -> None:
    from vitdeploy.evaluate.reliability import contention, sample

    print(f"cpu: {describe_cpu()}, {os.cpu_count()} logical CPUs, flags {' '.join(cpu_flags())}")
    checkpoint = work / f"{args.model}-hf"
    weights = make_checkpoint(args.model, checkpoint)
    print(f"model: {args.model}, random weights, {human(weights)} of FP32 weights ({checkpoint})")
    before, children = sample(), _children_cpu_s()
    wall, stages, held = run_export(checkpoint, work / "artifacts")
    window = contention(before, sample())
    if window is not None:  # the export runs in a child process: its CPU is the benchmark's own, not contention
        window = dataclasses.replace(window, others_s=max(0.0, window.others_s - (_children_cpu_s() - children)))
    print(f"contention while exporting: {window.describe() if window else 'unknown (no /proc/stat)'}")
    reference = next((s["seconds"] for s in stages if s["name"] == "reference" and s["seconds"]), None)
    print(f"held without the model: {human(held)} (the libraries and what they keep; each stage's peak over it below)")
    head = f"{'stage':<24} {'status':<8} {'seconds':>8} {'x ref':>6} {'peak RSS':>10} {'x weights':>9} over held"
    print(f"\n{head}")
    for s in stages:
        peak = s.get("peak_rss_bytes")
        ref = f"{s['seconds'] / reference:6.2f}" if reference else "     ?"
        ratio = f"{peak / weights:9.2f}" if peak else "        ?"
        over = f"{(peak - held) / weights:9.2f}" if peak and held else "        ?"
        print(f"{s['name']:<24} {s['status']:<8} {s['seconds']:8.1f} {ref} {human(peak):>10} {ratio} {over}")
    total = sum(s["seconds"] for s in stages)
    top = max((s for s in stages if s.get("peak_rss_bytes")), key=lambda s: s["peak_rss_bytes"], default=None)
    print(f"\nexport: {wall:.1f} s wall, {total:.1f} s in stages", end="")
    if reference:
        units = total / reference
        verdict = "meets" if units <= REFERENCE_GOAL else "misses"
        print(f" = {units:.1f} reference stages ({reference:.1f} s each; goal <= {REFERENCE_GOAL:g}: {verdict})")
    if top:
        ratio = top["peak_rss_bytes"] / weights
        peak = human(top["peak_rss_bytes"])
        over = (top["peak_rss_bytes"] - held) / weights if held else float("nan")
        verdict = "meets" if over <= MEMORY_GOAL else "misses"
        print(
            f"peak memory: {peak} in {top['name']} = {ratio:.1f}x the weights, {human(held)} held without the model "
            f"+ {over:.2f}x (goal: held + <= {MEMORY_GOAL:g}x: {verdict})"
        )
    if args.optimum:
        seconds = run_optimum(checkpoint, work / "optimum")
        print(f"optimum-cli export onnx: {seconds:.1f} s (exports the FP32 graph, no validation)" if seconds else "")


if __name__ == "__main__":
    main()
