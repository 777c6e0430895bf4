"""How close an embedding export's graphs stay to eager PyTorch, by the measures an embedding is judged by:
cosine per image (lowest, 1st percentile) and neighbour agreement (recall@10 over the validation inputs).

Two models, each exported with the defaults (`vitdeploy export`, ``--engine skip``: no TensorRT here) in a
subprocess: a DINOv2-S/14 with 4 registers (transformers' ``Dinov2WithRegistersModel``, random weights as
transformers initialises them, its hub processor: 224 px crop of a 256 px resize) and the embedded demo
model's backbone (``model.output: embedding``). Printed per model: every gate the export judged (FP32 graph,
ORT graph, FP16, INT8) with its cosine, recall@10 and verdict, the INT8 stage's outcome, and the export's time.

    .venv/bin/python benchmarks/bench_embedding.py [--keep DIR]
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_export import save_dinov2_processor  # noqa: E402

from vitdeploy.base.machine import describe_cpu  # noqa: E402

GOAL_COSINE, GOAL_RECALL = 0.99999, 1.0


def dinov2_small_registers(folder: Path) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Dinov2WithRegistersConfig(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        patch_size=14,
        image_size=518,
        num_register_tokens=4,
    )
    transformers.Dinov2WithRegistersModel(cfg).eval().save_pretrained(folder)
    save_dinov2_processor(folder)
    return folder


def export(model: dict, out: Path) -> tuple[float, dict, str]:
    config = out.parent / f"{out.name}.yaml"
    config.write_text(json.dumps({"model": model}))
    cli = [sys.executable, "-m", "vitdeploy.cli", "export", "-c", str(config), "-o", str(out), "--engine", "skip"]
    start = time.perf_counter()
    proc = subprocess.run(cli, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    manifest = out / "manifest.json"
    if not manifest.is_file():
        raise SystemExit(f"export failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, json.loads(manifest.read_text()), proc.stdout + proc.stderr


def report(title: str, wall: float, manifest: dict) -> None:
    print(f"\n{title}: {manifest['io']['output']['shape']} {manifest['output']}, export {wall:.0f} s")
    print(f"  {'gate':<24} {'cosine min':>12} {'cosine p01':>12} {'recall@10':>10} {'max|diff|':>10}  verdict")
    for gate, v in manifest["validation"].items():
        m = v.get("metrics", {})
        print(
            f"  {gate:<24} {m.get('cosine', float('nan')):>12.8f} {m.get('cosine_p01', float('nan')):>12.8f} "
            f"{m.get('recall_at_k', float('nan')):>10.3f} {m.get('max_abs_diff', float('nan')):>10.3g}  "
            + ("pass" if v.get("passed") else "FAIL")
        )
    fp32 = manifest["validation"]["validate-onnx"]["metrics"]
    met = fp32["cosine"] >= GOAL_COSINE and fp32["recall_at_k"] >= GOAL_RECALL
    print(f"  goal (FP32 cosine >= {GOAL_COSINE}, recall@10 = 1.0): {'met' if met else 'MISSED'}")
    for stage in manifest["stages"]:
        if stage["name"] in ("fp16", "int8") or stage["status"] == "skipped":
            print(f"  {stage['name']:<12} {stage['status']:<8} {stage['seconds']:7.1f}s  {stage['reason'][:150]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = ap.parse_args()
    print(f"machine: {describe_cpu()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ckpt = dinov2_small_registers(work / "dinov2-s14-reg")
        wall, manifest, _ = export({"checkpoint": str(ckpt)}, work / "dinov2-art")
        report("DINOv2-S/14 with 4 registers (random weights)", wall, manifest)
        wall, manifest, _ = export({"output": "embedding"}, work / "demo-art")
        report("the demo model's backbone (model.output: embedding)", wall, manifest)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
