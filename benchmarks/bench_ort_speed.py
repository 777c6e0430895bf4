"""ViT-B/16 FP32 latency at batch 1 on CPU: eager PyTorch vs vitdeploy's ONNX graphs vs Optimum's ONNX.

Product target (see benchmarks/README.md): with 2 threads, vitdeploy's `ort` path must be >= 1.5x faster
than eager PyTorch and >= 10% faster than Optimum's export run in ONNX Runtime with default settings.

Flow (all weights identical, random, seeded; nothing is downloaded):
  1. in the bench venv (transformers<4.58 + optimum-onnx, kept apart from the project venv):
     a random-weight HF ViTForImageClassification (ViT-B/16 config) -> save_pretrained -> optimum-cli export onnx;
  2. here: vitdeploy's load_checkpoint on that same HF folder -> export_onnx (model.onnx) ->
     optimize_for_ort (model.ort.onnx), plus any extra variants asked for;
  3. every variant timed in ONE process, interleaved round-robin (random order each round), repeated.

    .venv/bin/python benchmarks/bench_ort_speed.py    # defaults: 2 threads, 30 warm-up + 100 rounds, 2 repeats
    .venv/bin/python benchmarks/bench_ort_speed.py --variants all --iters 40 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from _common import background_load, contention_since, drift, environment, interleaved, ort_session, version  # noqa: E402

from vitdeploy.evaluate.reliability import sample  # noqa: E402

# name -> (graph, ORT settings) ; "eager" is PyTorch. Graphs: see build_graphs().
VARIANTS: dict[str, tuple[str, dict]] = {
    "ort": ("onnx", {}),  # model.onnx as OrtBackend runs it today
    "ort-opt": ("ort", {}),  # model.ort.onnx: fused MHA/SkipLN/BiasGelu, last block cls-only
    "ort-nospin": ("onnx", {"spinning": False}),
    "ort-opt-nospin": ("ort", {"spinning": False}),  # model.ort.onnx, idle threads block (no spinning)
    "ort-opt-spinstop": ("ort", {"spin_stop": True}),  # spin during a run, stop when it returns
    "optimum": ("optimum", {}),  # Optimum's export, ORT defaults + intra threads
    "optimum-nospin": ("optimum", {"spinning": False}),  # same session settings as ours: graph-only comparison
    "ort-legacy": ("legacy", {}),  # torch.onnx.export(dynamo=False), unfused
    "ort-opt-attn": ("ort-attn", {"spinning": False}),  # contrib Attention (does the qkv GEMM itself), all tokens
    "ort-opt-allrows": ("ort-allrows", {"spinning": False}),  # as ort-opt-nospin, last block for all 197 tokens
    "ort-opt-skipln": ("ort-skipln", {"spinning": False}),  # as ort-opt-nospin + SkipLayerNormalization
    "ort-opt-fastgelu": ("ort-fastgelu", {"spinning": False}),  # tanh GELU approximation: NOT exact
    "ort-extended": ("onnx", {"level": "extended"}),
    "ort-opt-inter1": ("ort", {"spinning": False, "inter_op": 1}),
}
DEFAULT_VARIANTS = ["eager", "ort", "ort-opt", "ort-opt-nospin", "optimum", "optimum-nospin"]
TARGET_VS_EAGER, TARGET_VS_OPTIMUM = 1.5, 1.10
# demo-style FP32 thresholds vs eager
MAX_ABS, MEAN_ABS = 1e-3, 1e-4


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- step 0/1: bench venv + Optimum


def ensure_bench_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if py.is_file() and (venv / "bin" / "optimum-cli").is_file():
        return py
    torch_pin = "torch==" + version("torch").split("+")[0]
    ort_pin = "onnxruntime==" + version("onnxruntime")
    log(f"creating bench venv {venv} ({torch_pin} first, then optimum-onnx, {ort_pin})")
    # the system python, not this venv's: the bench venv must not inherit the project's packages
    subprocess.run([shutil.which("python3") or "python3", "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [torch_pin], check=True)  # pinned CPU build first: never an unpinned torch
    subprocess.run(pip + ["optimum-onnx", ort_pin, torch_pin], check=True)
    return py


def make_optimum(py: Path, work: Path, seed: int) -> dict:
    cmd = [str(py), str(HERE / "make_optimum_export.py"), "--out", str(work), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"step 1 failed: {' '.join(cmd)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- step 2: our graphs


def build_graphs(model, cfg, work: Path, needed: set[str], reuse_onnx: bool = False) -> dict[str, Path]:
    from vitdeploy.export.onnx import export_onnx
    from vitdeploy.export.optimize import fused_op_counts, optimize_for_ort

    ours = work / "ours"
    graphs: dict[str, Path] = {"optimum": work / "optimum" / "model.onnx"}
    if reuse_onnx:
        graphs["onnx"] = ours / "model.onnx"
    else:
        t = time.perf_counter()
        graphs["onnx"] = export_onnx(model, ours / "model.onnx", image_size=cfg.image_size).path
        log(f"  export_onnx (dynamo, opset 18): {time.perf_counter() - t:.1f}s")
    jobs = {
        "ort": {},
        "ort-attn": {"attention": "Attention"},
        "ort-fastgelu": {"gelu_approximation": True},
        "ort-allrows": {"class_token_only": False},
        "ort-skipln": {"skip_layer_norm": True},
    }
    names = {
        "ort": "model.ort.onnx",
        "ort-attn": "model.ort.attention.onnx",
        "ort-fastgelu": "model.ort.fastgelu.onnx",
        "ort-allrows": "model.ort.allrows.onnx",
        "ort-skipln": "model.ort.skipln.onnx",
    }
    for key, kwargs in jobs.items():
        if key in needed:
            t = time.perf_counter()
            graphs[key] = optimize_for_ort(
                graphs["onnx"], ours / names[key], num_heads=cfg.heads, hidden_size=cfg.width, **kwargs
            )
            log(f"  optimize_for_ort -> {names[key]}: {time.perf_counter() - t:.1f}s {fused_op_counts(graphs[key])}")
    if "legacy" in needed:
        import torch

        t = time.perf_counter()
        graphs["legacy"] = ours / "model.legacy.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (torch.zeros(1, 3, cfg.image_size, cfg.image_size),),
                str(graphs["legacy"]),
                input_names=["pixel_values"],
                output_names=["logits"],
                opset_version=18,
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
                dynamo=False,
            )
        log(f"  torch.onnx.export(dynamo=False): {time.perf_counter() - t:.1f}s")
    return graphs


# --------------------------------------------------------------------------- step 3: timing


def round_ratio(timings, base: str, name: str) -> float:
    """Median over rounds of base/name latency, each round's pair measured back to back."""
    a, b = timings.samples_ms[base], timings.samples_ms[name]
    return float(np.median(np.asarray(a) / np.asarray(b)))


def table(timings, names: list[str], base_eager: str | None, base_opt: str | None) -> str:
    """Speed-ups are medians of per-round ratios (robust to load changing during the run)."""
    rows = [f"{'variant':18s} {'median ms':>10s} {'p90 ms':>9s} {'vs eager':>9s} {'vs optimum':>11s}"]
    for n in names:
        ve = f"{round_ratio(timings, base_eager, n):8.2f}x" if base_eager else "-"
        vo = f"{round_ratio(timings, base_opt, n):10.3f}x" if base_opt else "-"
        rows.append(f"{n:18s} {timings.median(n):10.1f} {timings.p90(n):9.1f} {ve:>9s} {vo:>11s}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bench-venv",
        type=Path,
        default=REPO / ".venv-bench",
        help="venv with optimum-onnx (created if missing; default: %(default)s)",
    )
    ap.add_argument("--workdir", type=Path, default=None, help="keep graphs here (default: a temp dir, removed)")
    ap.add_argument("--reuse", action="store_true", help="reuse graphs already in --workdir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=30, help="discarded rounds (default %(default)s)")
    ap.add_argument("--iters", type=int, default=100, help="timed rounds per repeat (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=2, help="whole measurements (default %(default)s)")
    ap.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma list or 'all' from: eager, {', '.join(VARIANTS)}",
    )
    ap.add_argument("--ours", default="ort-opt-nospin", help="variant checked against the target")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="sleep before each timed call")
    ap.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="run N busy-looping processes while timing (a shared CPU, reproducibly)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write all results here")
    args = ap.parse_args()

    names = (
        ["eager", *VARIANTS] if args.variants == "all" else [v.strip() for v in args.variants.split(",") if v.strip()]
    )
    unknown = [n for n in names if n != "eager" and n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}")

    import torch

    torch.set_num_threads(args.threads)
    env = environment(args.threads)
    env["torch_threads"] = torch.get_num_threads()
    log("== environment")
    log(json.dumps(env, indent=1))

    tmp = None
    work = args.workdir
    if work is None:
        tmp = Path(tempfile.mkdtemp(prefix="vit-bench-"))
        work = tmp
    work.mkdir(parents=True, exist_ok=True)
    try:
        # 1. HF model + Optimum export (bench venv)
        info_path = work / "optimum-info.json"
        if args.reuse and info_path.is_file() and (work / "optimum" / "model.onnx").is_file():
            info = json.loads(info_path.read_text())
        else:
            py = ensure_bench_venv(args.bench_venv)
            t = time.perf_counter()
            info = make_optimum(py, work, args.seed)
            info_path.write_text(json.dumps(info))
            log(f"== step 1 (bench venv): HF model + optimum-cli export in {time.perf_counter() - t:.1f}s")
        log(f"bench venv versions: {info['versions']}")
        log(f"optimum command: {info['command']}")

        # 2. the same weights through vitdeploy
        from vitdeploy.model.checkpoints import load_checkpoint

        loaded = load_checkpoint(work / "hf")
        model, cfg = loaded.model, loaded.config
        log(f"== step 2: vitdeploy {cfg}")
        needed = {VARIANTS[n][0] for n in names if n != "eager"}
        if args.reuse and all((work / "ours" / f).is_file() for f in ("model.onnx",)):
            graphs = {"optimum": work / "optimum" / "model.onnx", "onnx": work / "ours" / "model.onnx"}
            extra = {
                "ort": "model.ort.onnx",
                "ort-attn": "model.ort.attention.onnx",
                "ort-fastgelu": "model.ort.fastgelu.onnx",
                "ort-allrows": "model.ort.allrows.onnx",
                "ort-skipln": "model.ort.skipln.onnx",
                "legacy": "model.legacy.onnx",
            }
            missing = {k for k in needed if k in extra and not (work / "ours" / extra[k]).is_file()}
            graphs.update({k: work / "ours" / v for k, v in extra.items() if k in needed and k not in missing})
            if missing:
                graphs.update(build_graphs(model, cfg, work, missing, reuse_onnx=True))
        else:
            graphs = build_graphs(model, cfg, work, needed)

        # 3. sessions, drift, interleaved timing
        rng = np.random.default_rng(args.seed)
        x = rng.standard_normal((1, 3, cfg.image_size, cfg.image_size)).astype(np.float32)
        xt = torch.from_numpy(x)
        fns, runners = {}, {}
        for n in names:
            if n == "eager":

                def run_eager(inp, m=model):
                    with torch.inference_mode():
                        return m(torch.from_numpy(inp)).numpy()

                runners[n] = run_eager
                fns[n] = lambda: run_eager(x)
                continue
            graph, settings = VARIANTS[n]
            sess = ort_session(str(graphs[graph]), threads=args.threads, **settings)
            iname = sess.get_inputs()[0].name
            runners[n] = lambda inp, s=sess, i=iname: s.run(None, {i: inp})[0]
            fns[n] = lambda s=sess, i=iname: s.run(None, {i: x})
        del xt

        checks = [rng.standard_normal((1, 3, cfg.image_size, cfg.image_size)).astype(np.float32) for _ in range(8)]
        ref = np.concatenate([runners["eager"](c) if "eager" in runners else _eager(model, c) for c in checks])
        drifts = {}
        log("== drift vs eager PyTorch FP32 (8 random inputs, batch 1)")
        for n in names:
            if n == "eager":
                continue
            got = np.concatenate([runners[n](c) for c in checks])
            drifts[n] = drift(ref, got)
            ok = (
                drifts[n]["max_abs_diff"] <= MAX_ABS
                and drifts[n]["mean_abs_diff"] <= MEAN_ABS
                and drifts[n]["top1_agreement"] == 1.0
            )
            log(
                f"  {n:18s} max|diff| {drifts[n]['max_abs_diff']:.2e}  mean {drifts[n]['mean_abs_diff']:.2e}  "
                f"top-1 {drifts[n]['top1_agreement']:.3f}  {'ok' if ok else 'FAILS FP32 thresholds'}"
            )

        results = []
        for rep in range(args.repeat):
            log(
                f"== repeat {rep + 1}/{args.repeat}: {args.warmup} warm-up + {args.iters} timed rounds, "
                f"{len(fns)} variants, {args.background_load} background busy processes"
            )
            t, before = time.perf_counter(), sample()
            total = args.warmup + args.iters

            def progress(r: int, total: int = total) -> None:
                if r % 10 == 0 or r == total:
                    print(
                        f"   round {r}/{total} ({'warm-up' if r <= args.warmup else 'timed'})",
                        file=sys.stderr,
                        flush=True,
                    )

            with background_load(args.background_load):
                timings = interleaved(
                    fns,
                    warmup=args.warmup,
                    iters=args.iters,
                    seed=args.seed + rep,
                    gap_s=args.gap_ms / 1000,
                    progress=progress,
                )
            log(f"   ({time.perf_counter() - t:.0f}s; {contention_since(before)})")
            log(table(timings, names, "eager" if "eager" in fns else None, "optimum" if "optimum" in fns else None))
            rec = {
                n: {"median_ms": timings.median(n), "p90_ms": timings.p90(n), "mean_ms": timings.mean(n)}
                for n in names
            }
            for n in names:
                for base in ("eager", "optimum"):
                    if base in fns:
                        rec[n][f"speedup_vs_{base}"] = round_ratio(timings, base, n)
            if args.ours in fns:
                if "eager" in fns:
                    r = round_ratio(timings, "eager", args.ours)
                    log(
                        f"   target {args.ours} vs eager:   {r:.2f}x (need >= {TARGET_VS_EAGER}x) "
                        f"{'PASS' if r >= TARGET_VS_EAGER else 'FAIL'}"
                    )
                if "optimum" in fns:
                    r = round_ratio(timings, "optimum", args.ours)
                    log(
                        f"   target {args.ours} vs optimum: {r:.3f}x (need >= {TARGET_VS_OPTIMUM}x) "
                        f"{'PASS' if r >= TARGET_VS_OPTIMUM else 'FAIL'}"
                    )
            results.append({"timings": rec, "samples_ms": timings.samples_ms})
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "environment": env,
                        "bench_venv": info,
                        "args": vars(args)
                        | {"bench_venv": str(args.bench_venv), "workdir": str(args.workdir), "json": str(args.json)},
                        "drift": drifts,
                        "repeats": results,
                    },
                    indent=1,
                    default=str,
                )
            )
            log(f"wrote {args.json}")
        return 0
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _eager(model, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


if __name__ == "__main__":
    sys.exit(main())
