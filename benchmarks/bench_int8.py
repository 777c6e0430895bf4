"""INT8 on the CPU: `ort-int8` (model.int8.onnx) vs our FP32 `ort` vs eager PyTorch, batch 1 and 8.

Two questions, answered apart (on random weights a drift gate means nothing, and on a trained model
the autopilot may return most of the graph to float, which says nothing about INT8's speed):

- SPEED: the fully quantized static graph (every MatMul/Gemm INT8, autopilot off, no drift gate, no
  speed gate) of ``--model`` with random weights. Issue 14's target, on ViT-B/16, 2 threads, a quiet
  machine: `ort-int8` >= 3.3x our FP32 `ort` at batch 1 and >= 3.0x at batch 8.
- ACCURACY: the trained demo model exported as a user gets it (validation.int8 and the autopilot),
  judged against eager FP32 on its real validation images.

Every variant is timed in ONE process, interleaved round-robin (fresh random order each round),
so load from other work falls on all alike; each figure is printed with its spread (p90/p50),
the CPU time other processes (and steal) took while timed, and a ratio is flagged unreliable (vitdeploy/evaluate/
reliability.py) when either figure's spread is above the limit or other work competed for the
cores. Figures taken on a shared, loaded machine are not evidence for or against the target.

    .venv/bin/python benchmarks/bench_int8.py                                # demo model (a smoke run)
    .venv/bin/python benchmarks/bench_int8.py --model vit_base_patch16_224   # the target's model
    .venv/bin/python benchmarks/bench_int8.py --model clip_vit_base_patch16_224  # CLIP ViT-B/16's image tower
    .venv/bin/python benchmarks/bench_int8.py --dynamic                      # also time the dynamic mode
    .venv/bin/python benchmarks/bench_int8.py --model vit_base_patch16_224 --attention-float --profile
        # + the graph with attention float (before issue 41) in the same rounds, and where each graph's time goes
    .venv/bin/python benchmarks/bench_int8.py --model vit_base_patch16_224 --threads 1 --cpu-time
        # each call's CPU time on one thread: ratios that other work on a shared machine hardly moves
    .venv-ov/bin/python benchmarks/bench_int8.py                             # + OpenVINO FP32 / BF16 / INT8

Where ``openvino`` (and, for INT8, ``nncf``) import, OpenVINO runs in the same interleaved rounds
(benchmarks/_openvino.py: our ``model.onnx``, CPU, latency hint, one stream, --threads; INT8 by
NNCF calibrated on the images our int8 stage calibrates on), and a summary compares ``ort-int8``
with ``openvino-int8``: speed ratio, and top-1 agreement / min cosine vs eager FP32 on the
export's validation images. Issue 14: ``ort-int8`` must be more accurate at >= 0.9x its speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from _common import drift, environment, interleaved, version  # noqa: E402

TARGETS = {1: 3.3, 8: 3.0}  # ort-int8 vs ort, ViT-B/16
#: issue 50: a CLIP ViT-B/16 tower's ort-int8 vs ort at batch 8 (and recall@10 >= 0.9 vs eager on real photos: on
#: random weights only the export's own validate-int8 record says it, printed below)
CLIP_TARGETS = {8: 2.5}


def clip_variants() -> dict:
    """CLIP image towers by name (our ViT with CLIP's parts: the norm before the blocks, QuickGELU, eps 1e-5, the
    projection; an embedding model), as OpenAI's ViT-B/16 and ViT-L/14 are shaped."""
    from vitdeploy.model.vit import ViTConfig

    tower = dict(norm_pre=True, act="quick_gelu", layer_norm_eps=1e-5, num_classes=0)
    return {
        "clip_vit_base_patch16_224": ViTConfig(patch_size=16, proj_dim=512, **tower),
        "clip_vit_large_patch14_224": ViTConfig(patch_size=14, width=1024, depth=24, heads=16, proj_dim=768, **tower),
    }


OV_SPEED = 0.9  # ort-int8 must run at >= 0.9x openvino-int8's speed (issue 14)


PERMISSIVE = {
    "max_abs_diff": 1e9,
    "mean_abs_diff": 1e9,
    "min_cosine": -1.0,
    "min_top1_agreement": 0.0,
    "min_top5_overlap": 0.0,
    "min_recall_at_k": 0.0,  # an embedding model's (a CLIP tower)
}


def _config_data(model: str, cache: Path, purpose: str = "speed") -> dict:
    """The pipeline config the export runs with (the demo model, or a random-weight checkpoint in
    ``cache``). ``speed``: every MatMul/Gemm INT8 whatever the drift (autopilot off, permissive gate);
    ``accuracy``: the user's defaults (validation.int8, the autopilot). The speed gate is off in both."""
    int8: dict = {"enabled": True, "min_speedup": 0}
    data: dict = {"export": {"fp16": {"enabled": False}, "int8": int8}}
    if purpose == "speed":
        int8["autopilot"] = False
        data["validation"] = {"int8": PERMISSIVE}
    if model != "demo":
        data["model"] = {"checkpoint": str(cache / f"{model}-random-checkpoint")}
    return data


def export(model: str, cache: Path, purpose: str = "speed") -> Path:
    """The export to time (``speed``) or judge (``accuracy``): the demo model, or a VARIANTS ViT with
    random weights (INT8 required)."""
    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    out = cache / f"{model}-int8-{purpose}"
    if (out / "manifest.json").is_file():
        return out
    data = _config_data(model, cache, purpose)
    if model != "demo":
        import torch

        from vitdeploy.base.preprocess_spec import CLIP_MEAN, CLIP_STD, PreprocessSpec
        from vitdeploy.model.checkpoints import save_checkpoint
        from vitdeploy.model.vit import VARIANTS, VisionTransformer

        torch.manual_seed(0)
        clip = clip_variants()
        cfg = clip[model] if model in clip else VARIANTS[model]
        pre = PreprocessSpec(style="hf", height=cfg.image_size, width=cfg.image_size)
        if model in clip:  # CLIP's own: shorter side to 224, centre crop, bicubic, OpenAI's mean / std
            pre = PreprocessSpec(style="timm", crop_pct=1.0, interpolation="bicubic", mean=CLIP_MEAN, std=CLIP_STD)
        save_checkpoint(
            Path(data["model"]["checkpoint"]),
            VisionTransformer(cfg).eval(),
            [f"class_{i}" for i in range(cfg.num_classes)],
            pre,
            f"{model}-random",
        )
    print(f"exporting {model} into {out} ...", flush=True)
    start = time.perf_counter()
    run_export(parse_config(data, None), out, engine="skip", validation_batch=(1, 8), heartbeat_s=None)
    print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def open_variants(out: Path, threads: int, dynamic: bool) -> dict:
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import BackendOptions, open_backend

    artifacts = Artifacts.open(out)
    opts = BackendOptions(device="cpu", providers=("CPUExecutionProvider",), threads=threads)
    backends = {name: open_backend(name, artifacts, opts) for name in ("torch", "ort", "ort-int8")}
    if dynamic:
        from vitdeploy.export.quantize import quantize_int8
        from vitdeploy.runtime.backends.ort import OrtBackend

        path = out.parent / f"{out.name}-dynamic.onnx"
        if not path.is_file():
            quantize_int8(out / "model.ort.onnx", path, input_name=artifacts.input_name, mode="dynamic")
        backends["ort-int8-dynamic"] = OrtBackend(path, artifacts.input_shape, None, opts, name="ort-int8-dynamic")
    return backends


def add_attention_float(args: argparse.Namespace, out: Path, backends: dict, threads: int) -> None:
    """``ort-int8-attn-float``: the same static graph with attention float in the fused node (what
    model.int8.onnx was before issue 41), calibrated on the export's own calibration images."""
    import dataclasses

    from vitdeploy.export.quantize import ORT_CPU, quantize_int8
    from vitdeploy.runtime.backends import BackendOptions
    from vitdeploy.runtime.backends.ort import OrtBackend

    path = out.parent / f"{out.name}-attention-float.onnx"
    if not path.is_file():
        _, calibration = export_images(args.model, args.cache, out)
        placement = dataclasses.replace(ORT_CPU, attention=False)
        quantize_int8(
            out / "model.ort.onnx", path, input_name="pixel_values", calibration=calibration, placement=placement
        )
    opts = BackendOptions(device="cpu", providers=("CPUExecutionProvider",), threads=threads)
    shape = backends["ort"].input_shape
    backends["ort-int8-attn-float"] = OrtBackend(path, shape, None, opts, name="ort-int8-attn-float")


def export_images(model: str, cache: Path, out: Path, purpose: str = "speed") -> tuple[np.ndarray, np.ndarray]:
    """The export's real validation images (noise rows left out) and the ones its int8 stage
    calibrated on, chosen, preprocessed and picked by the export's own functions."""
    from vitdeploy.base.config import parse_config
    from vitdeploy.export.int8_calibration import calibration_batch
    from vitdeploy.export.pipeline import validation_images
    from vitdeploy.export.validate import build_inputs
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.preprocess import Preprocessor

    cfg, artifacts = parse_config(_config_data(model, cache, purpose), None), Artifacts.open(out)
    inputs = build_inputs(
        Preprocessor(artifacts.preprocess),
        validation_images(cfg),
        noise_samples=0,
        seed=cfg.validation.seed,
        min_count=1,
    )
    section = cfg.export.int8
    calibration = calibration_batch(
        inputs.batch, inputs.names, max_images=section.calibration_images, min_images=section.min_calibration_images
    )
    recorded = artifacts.manifest.get("export", {}).get("int8", {}).get("calibration_images")
    if recorded is not None and recorded != len(calibration):
        raise SystemExit(
            f"{out}: the int8 stage calibrated on {recorded} images, the benchmark picked "
            f"{len(calibration)}; delete the cached export and run again"
        )
    return calibration_batch(inputs.batch, inputs.names, max_images=len(inputs.names), min_images=1), calibration


def open_openvino(args: argparse.Namespace, out: Path, backends: dict) -> tuple[np.ndarray, int] | None:
    """Add the OpenVINO variants that can run here to ``backends``; the export's real validation
    images (to judge accuracy on) and how many of them calibrate, or None when OpenVINO is left out
    (one line says why)."""
    import _openvino

    reason = "openvino variants skipped (--no-openvino)" if args.no_openvino else _openvino.missing()
    if reason:
        print(reason)
        return None
    from vitdeploy.runtime.artifacts import Artifacts

    images, calibration = export_images(args.model, args.cache, out)
    runners, notes = _openvino.open_variants(
        Artifacts.open(out).path("onnx"),
        backends["ort"].input_shape,
        args.threads,
        lambda: calibration,
        out.parent / f"{out.name}-openvino-int8.xml",
        pinning=False if args.openvino_no_pinning else None,
    )
    backends.update(runners)
    for note in notes:
        print(note)
    return images, len(calibration)


def accuracy(backends: dict, images: np.ndarray) -> dict[str, dict]:
    """Every variant's logits on ``images`` against eager FP32 (the ``torch`` backend)."""
    from vitdeploy.export.compare import logit_metrics
    from vitdeploy.export.validate import run_in_batches

    ref = run_in_batches(backends["torch"], images, 8)
    out = {}
    for name, b in backends.items():
        if name != "torch":
            metrics, flipped = logit_metrics(ref, run_in_batches(b, images, 8))
            out[name] = {**metrics, "flipped": len(flipped)}
    return out


def openvino_summary(by: dict, acc: dict[str, dict], images: int, batches: list[int], busy: str | None) -> dict:
    """ort-int8 against openvino-int8: issue 14 wants better accuracy at >= 0.9x its speed."""
    from vitdeploy.evaluate.reliability import SPREAD_LIMIT

    ours, theirs = acc["ort-int8"], acc["openvino-int8"]
    speed = {b: by[b, "openvino-int8"]["p50_ms"] / by[b, "ort-int8"]["p50_ms"] for b in batches}
    pairs = [(ours["top1_agreement"], theirs["top1_agreement"]), (ours["cosine"], theirs["cosine"])]
    better = all(o >= t for o, t in pairs) and any(o > t for o, t in pairs)
    fast = all(v >= OV_SPEED for v in speed.values())
    unreliable = bool(busy) or any(
        by[b, v]["spread"] > SPREAD_LIMIT for b in batches for v in ("ort-int8", "openvino-int8")
    )
    verdict = "PASS" if better and fast else "FAIL"
    print(
        "\nort-int8 vs openvino-int8: speed "
        + ", ".join(f"batch {b} {v:.2f}x" for b, v in speed.items())
        + f" (openvino-int8 p50 / ort-int8 p50, wanted >= {OV_SPEED}x); on {images} validation images vs eager: "
        f"top-1 {ours['top1_agreement']:.2%} vs {theirs['top1_agreement']:.2%}, min cosine {ours['cosine']:.5f} vs "
        f"{theirs['cosine']:.5f} -> {verdict}: {'better' if better else 'not better'} accuracy at "
        f"{'>=' if fast else '<'} {OV_SPEED}x its speed" + (" (*timing unreliable)" if unreliable else "")
    )
    return {
        "speed_vs_openvino_int8": speed,
        "better_accuracy": better,
        "fast_enough": fast,
        "verdict": verdict,
        "unreliable": unreliable,
    }


def openvino_report(
    backends: dict, images: np.ndarray, calibrated: int, by: dict, batches: list[int], busy: str | None
) -> dict:
    """Print what OpenVINO compiled, every variant's accuracy on the export's validation images, and
    the ort-int8 vs openvino-int8 verdict."""
    compiled = {n: b.compiled_properties for n, b in backends.items() if hasattr(b, "compiled_properties")}
    for name, props in compiled.items():
        print(f"{name} compiled with {props}")
    acc = accuracy(backends, images)
    print(
        f"\naccuracy vs eager FP32 on the export's {len(images)} real validation images (the first {calibrated} of "
        f"them calibrated both INT8 variants):\n{'variant':<20} {'top1':>7} {'flips':>6} {'min cosine':>11} "
        f"{'max|diff|':>10}"
    )
    for name, m in acc.items():
        print(
            f"{name:<17} {m['top1_agreement']:>7.2%} {m['flipped']:>6} {m['cosine']:>11.6f} {m['max_abs_diff']:>10.3g}"
        )
    report = {"compiled": compiled, "accuracy": acc, "images": len(images)}
    if "openvino-int8" in acc:
        report["summary"] = openvino_summary(by, acc, len(images), batches, busy)
    else:
        print("ort-int8 vs openvino-int8: no comparison (openvino-int8 did not run here)")
    return report


def accuracy_report(cache: Path, threads: int) -> dict:
    """ACCURACY: the trained demo model as a user exports it (validation.int8, autopilot), against
    eager FP32 on its real validation images."""
    from vitdeploy.runtime.artifacts import Artifacts

    out = export("demo", cache, "accuracy")
    manifest = Artifacts.open(out).manifest
    record = manifest["export"]["int8"]
    backends = {k: v for k, v in open_variants(out, threads, False).items() if k in ("torch", "ort-int8")}
    images, _ = export_images("demo", cache, out, "accuracy")
    acc = accuracy(backends, images)["ort-int8"]
    for b in backends.values():
        b.close()
    steps = record.get("autopilot") or []
    print(
        f"\nACCURACY: the trained demo model, exported with the defaults (validation.int8, autopilot): "
        f"{record['quantized_nodes']} MatMul/Gemm INT8, {len(record['keep_float'])} returned to float "
        f"({len(steps)} autopilot step(s)); on {len(images)} real validation images vs eager FP32: top-1 "
        f"{acc['top1_agreement']:.2%} ({acc['flipped']} flipped), min cosine {acc['cosine']:.6f}, max|diff| "
        f"{acc['max_abs_diff']:.3g}"
    )
    return {
        "quantized_nodes": record["quantized_nodes"],
        "keep_float": record["keep_float"],
        "images": len(images),
        **acc,
    }


def profile(backends: dict, shape: tuple, batches: list[int], threads: int) -> dict:
    """Where ort and ort-int8 spend their time, by op type, at each batch (benchmarks/_ort_profile.py)."""
    from _ort_profile import op_type_times, print_shares

    out = {}
    for batch in batches:
        x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)
        columns = {
            name: op_type_times(str(backends[name].onnx_path), x, threads, config=backends[name].session_config)
            for name in ("ort", "ort-int8")
        }
        print_shares(f"where the time goes at batch {batch} (ONNX Runtime's profiler, each node's median)", columns)
        out[batch] = columns
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default="demo",
        help="demo, a vitdeploy VARIANTS name (vit_base_patch16_224) or a CLIP tower (clip_vit_base_patch16_224)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--dynamic", action="store_true", help="also time export.int8.mode: dynamic (batch-dependent)")
    ap.add_argument(
        "--no-openvino", action="store_true", help="leave the OpenVINO variants out where openvino imports"
    )
    ap.add_argument(
        "--openvino-no-pinning",
        action="store_true",
        help="ENABLE_CPU_PINNING off for OpenVINO (ORT does not pin; OpenVINO's default pins its threads)",
    )
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time each call's CPU time on the calling thread (with --threads 1): robust to other work on the machine",
    )
    ap.add_argument(
        "--attention-float",
        action="store_true",
        help="also time the static graph with attention float (ort-int8-attn-float: model.int8.onnx before issue 41)",
    )
    ap.add_argument(
        "--profile", action="store_true", help="also print where ort and ort-int8 spend their time, by op type"
    )
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "vitdeploy-bench-int8")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    from vitdeploy.evaluate.reliability import SPREAD_LIMIT, busy_machine_reason, contention, sample, usable_cores

    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time times the calling thread: use it with --threads 1")
    args.cache.mkdir(parents=True, exist_ok=True)
    out = export(args.model, args.cache)
    backends = open_variants(out, args.threads, args.dynamic)
    if args.attention_float:
        add_attention_float(args, out, backends, args.threads)
    openvino = open_openvino(args, out, backends)
    env = environment(args.threads)
    if openvino is not None:
        env["versions"].update({d: version(d) for d in ("openvino", "nncf")})
    print(f"cpu: {env['cpu']} flags {env['cpu_flags']}, {usable_cores()} usable cores, {args.threads} threads")
    print(f"versions: {env['versions']}")
    rng = np.random.default_rng(0)
    shape = backends["ort"].input_shape
    print(f"\nSPEED: {args.model}, random weights" if args.model != "demo" else "\nSPEED: demo model", end="")
    print(", the fully quantized static graph (every MatMul/Gemm INT8; accuracy not judged here)")
    rows, before = [], sample()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    for batch in batches:
        x = rng.standard_normal((batch, *shape)).astype(np.float32)
        ref = backends["torch"].run(x)
        for b in backends.values():
            if hasattr(b, "prepare"):  # OpenVINO: compile for this batch size before timing
                b.prepare(batch)
        fns = {name: (lambda b=b: b.run(x)) for name, b in backends.items()}
        clock = time.thread_time if args.cpu_time else time.perf_counter
        timings = interleaved(fns, warmup=args.warmup, iters=args.iters, seed=batch, clock=clock)
        for name, b in backends.items():
            p50, p90 = timings.median(name), timings.p90(name)
            rows.append(
                {
                    "batch": batch,
                    "variant": name,
                    "p50_ms": p50,
                    "p90_ms": p90,
                    "spread": p90 / p50,
                    "ms_per_img": p50 / batch,
                    **drift(ref, b.run(x)),
                }
            )
    window = contention(before, sample(), usable_cores())
    busy = busy_machine_reason(window, args.threads)
    by = {(r["batch"], r["variant"]): r for r in rows}
    print(
        f"\ncontention while timed: {window.describe() if window else 'unknown'}"
        + (f"  -> BUSY: {busy}" if busy else "")
    )
    print(
        f"{'batch':>5} {'variant':<20} {'p50 ms':>9} {'p90/p50':>8} {'ms/img':>8} {'vs ort':>8} {'vs eager':>9} "
        f"{'max|diff|':>10} {'top1':>6}  flags"
    )
    for r in rows:
        base, eager = by[r["batch"], "ort"], by[r["batch"], "torch"]
        r["vs_ort"], r["vs_eager"] = base["p50_ms"] / r["p50_ms"], eager["p50_ms"] / r["p50_ms"]
        spread = [f"{v['variant']} p90/p50 {v['spread']:.2f}" for v in (r, base, eager) if v["spread"] > SPREAD_LIMIT]
        r["unreliable"] = sorted(set(spread)) + ([busy] if busy else [])
        goals = CLIP_TARGETS if args.model.startswith("clip_") else TARGETS
        target = goals.get(r["batch"]) if r["variant"] == "ort-int8" else None
        flag = ("*unreliable: " + "; ".join(r["unreliable"])) if r["unreliable"] else ""
        print(
            f"{r['batch']:>5} {r['variant']:<20} {r['p50_ms']:>9.3f} {r['spread']:>8.2f} {r['ms_per_img']:>8.3f} "
            f"{r['vs_ort']:>7.2f}x {r['vs_eager']:>8.2f}x {r['max_abs_diff']:>10.3g} {r['top1_agreement']:>6.2f}  "
            f"{flag}{'' if target is None else f'  (ViT-B/16 target vs ort: >= {target}x)'}"
        )
    if args.model.startswith("clip_"):  # an embedding: its INT8 judged by recall@k, recorded by the export
        metrics = json.loads((out / "manifest.json").read_text())["validation"]["validate-int8"]["metrics"]
        print(
            f"validate-int8 (the export's, random weights): recall@k {metrics.get('recall_at_k')}, "
            f"cosine {metrics.get('cosine')} (issue 50's recall@10 >= 0.9 is for trained weights on real photos)"
        )
    print(
        "\nvs ort / vs eager: that variant's p50 against our FP32 ort / eager PyTorch at the same batch (higher = "
        "faster);"
        " max|diff|, top1: against eager on the timed (random) batch."
    )
    if args.model not in ("vit_base_patch16_224", "clip_vit_base_patch16_224"):
        print(
            f"note: {args.model} is not the target's model (ViT-B/16): these ratios do not speak to the 3.3x / 3.0x "
            "target."
        )
    if busy or any(r["unreliable"] for r in rows):
        print(
            "warning: ratios marked * are unreliable (other work competed for the cores, or a figure's spread is "
            "high); figures from a shared, loaded machine are not evidence for or against the target."
        )
    if args.cpu_time:
        print("times: each call's CPU time on the calling thread (1 intra-op thread), not the wall clock")
    result = {
        "env": env,
        "contention": window.to_dict() if window else None,
        "busy": busy,
        "clock": "thread CPU time" if args.cpu_time else "wall",
        "rows": rows,
        "profile": profile(backends, shape, batches, args.threads) if args.profile else None,
        "accuracy": accuracy_report(args.cache, args.threads),
    }
    if openvino is not None:
        result["openvino"] = openvino_report(backends, *openvino, by, batches, busy)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    for b in backends.values():
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
