"""`vitdeploy batch-predict` (Ray Data) against `vitdeploy predict` on the same folder of JPEG photos.

Target: for a ViT-S/16 (random weights) batch-predict's images/s is >= 0.9x predict's on the same
artifacts, ONNX Runtime threads and machine (there is no serving overhead to hide behind), and the
images/s per worker as workers are added.

Both commands run as a user runs them, as subprocesses, timed wall clock from start to exit (so Ray's
start-up is inside batch-predict's time, as the interpreter's start-up is inside predict's):

* ``predict``          ``vitdeploy predict DIR --json`` (decode and model one after the other, one process);
* ``batch, N worker``  ``vitdeploy batch-predict DIR -o x.parquet --workers N`` on a local Ray: decoding
                       tasks beside N inference actors; each actor uses ``--threads`` / N intra-op threads;
* ``batch, auto worker`` batch-predict with its defaults (``batch.workers`` auto: one 1-thread actor per core);
                       the target is judged on it.

``--models vit-s16-emb``: the same ViT-S/16 exported as an embedding model (``model.output: embedding``, its
384-value pooled features, no head): ``predict --json`` prints the vectors, batch-predict writes them to
Parquet (fixed-size lists); target >= 0.95x predict.

Both take batches of the export's profile opt. The images are the real photographs scikit-image
bundles (as in bench_serve.py), saved as JPEG and copied to ``--images`` files. Variants run in rounds
whose order rotates; each ratio is taken within a round, the median over rounds printed with its
spread. Beside every run: the load average and the CPU time other processes took during it (cores
busy outside the benchmark, from /proc/stat minus this benchmark's own process tree). A ratio is
flagged only when that contention or the spread makes it unreliable.

    .venv/bin/python benchmarks/bench_batch.py                       # ViT-S/16, 2000 photos, 3 rounds
    .venv/bin/python benchmarks/bench_batch.py --models demo --images 400 --rounds 2
    .venv/bin/python benchmarks/bench_batch.py --models vit-s16,vit-s16-emb --workers auto   # both targets
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _serve_kit import DEFAULT_CACHE, cpu_seconds, demo_artifacts, loadavg, photos, spread, vit_small_artifacts  # noqa: E402

from vitdeploy.base.machine import cpu_model  # noqa: E402

#: batch-predict / predict for each model judged: classification (top-k rows), embeddings (Parquet vectors)
TARGETS = {"vit-s16": 0.9, "vit-s16-emb": 0.95}
LABELS = {
    "vit-s16": "ViT-S/16 224, random weights",
    "vit-s16-emb": "ViT-S/16 224 embeddings (384 float32), random weights",
    "demo": "demo model (32 px)",
}
VITDEPLOY = str(Path(sys.executable).with_name("vitdeploy"))


def busy_seconds() -> float:
    """CPU seconds (all cores, user+nice+system+irq+softirq+steal) the machine spent so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / tick


def collection(cache: Path, n: int) -> Path:
    """``n`` JPEG files, the six photographs over and over, in sub-folders of 500."""
    root = cache / f"photos-{n}"
    if (root / ".complete").is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    blobs = photos()
    for i in range(n):
        folder = root / f"{i // 500:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{i:05d}.jpg").write_bytes(blobs[i % len(blobs)])
    (root / ".complete").touch()
    return root


def vit_small_embedding_artifacts(cache: Path) -> Path:
    """The random-weight ViT-S/16 of :func:`_serve_kit.vit_small_artifacts` exported as an embedding model."""
    out = cache / "vit-s16-hf-random-emb-art"
    if (out / "manifest.json").is_file():
        return out
    from vitdeploy.base.config import parse_config
    from vitdeploy.export.pipeline import run_export

    vit_small_artifacts(cache)  # writes the checkpoint beside it
    print(f"exporting the random-weight ViT-S/16 as an embedding model into {out} ...", flush=True)
    run_export(
        parse_config(
            {
                "model": {"checkpoint": str(cache / "vit-s16-hf-random"), "output": "embedding"},
                "export": {"fp16": {"enabled": False}},
                "validation": {"max_images": 8, "noise_samples": 2},
            }
        ),
        out,
        engine="skip",
    )
    return out


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall s, CPU cores other processes kept busy meanwhile, exit code, stderr tail)."""
    busy0, t0, self0 = busy_seconds(), time.perf_counter(), os.times()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mine: dict[int, tuple[str, float]] = {}
    while proc.poll() is None:  # our tree's CPU, sampled: Ray's workers leave before the parent returns
        for pid, rec in cpu_seconds([proc.pid]).items():
            mine[pid] = rec
        time.sleep(0.5)
    err = proc.stderr.read() if proc.stderr else ""
    wall = time.perf_counter() - t0
    self1 = os.times()
    own = sum(secs for _, secs in mine.values()) + (self1.user + self1.system - self0.user - self0.system)
    others = max(0.0, busy_seconds() - busy0 - own) / wall
    return wall, others, proc.returncode, err.strip().splitlines()[-1] if err.strip() else ""


def bench_model(label: str, artifacts: Path, args: argparse.Namespace, images: Path, n: int) -> dict[str, object]:
    from vitdeploy.runtime.artifacts import Artifacts

    opt = Artifacts.open(artifacts).batch["opt"]
    work = Path(tempfile.mkdtemp(prefix="bb", dir="/tmp"))
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "VITDEPLOY_ARTIFACT_CACHE": str(work / "cache"),
        "RAY_TMPDIR": str(work / "ray"),
    }
    variants: dict[str, list[str]] = {}
    for workers in args.workers:
        cfg = work / f"w{workers}.yaml"
        if workers == "auto":  # the defaults, as a user without a batch: section gets them
            cfg.write_text(f"runtime:\n  batch_size: {opt}\n")
        else:
            threads = max(1, args.threads // workers)
            pool = (
                ""
                if workers == 1
                # 1 worker: the defaults; more: the CPUs shared, half a CPU for decoding
                else (
                    f"  cpus_per_worker: {max(0.25, ((os.cpu_count() or 2) - 0.5) / workers):.2f}\n"
                    "  decode_cpus: 0.5\n"
                )
            )
            cfg.write_text(
                f"runtime:\n  threads: {threads}\n  batch_size: {opt}\nbatch:\n  workers: {workers}\n{pool}"
            )
        variants[f"batch, {workers} worker"] = [
            VITDEPLOY,
            "batch-predict",
            str(images),
            "-a",
            str(artifacts),
            "-b",
            "ort",
            "-c",
            str(cfg),
            "-o",
            "{out}",
        ]
    pcfg = work / "predict.yaml"
    pcfg.write_text(f"runtime:\n  threads: {args.threads}\n  batch_size: {opt}\n")
    variants["predict"] = [
        VITDEPLOY,
        "predict",
        str(images),
        "-a",
        str(artifacts),
        "-b",
        "ort",
        "-c",
        str(pcfg),
        "--json",
    ]
    print(
        f"\n{label}: {n} JPEG photos, batch {opt}, {args.threads} ONNX Runtime threads in all; load average "
        f"{loadavg()}",
        flush=True,
    )
    rates: dict[str, list[float]] = {k: [] for k in variants}
    others: dict[str, list[float]] = {k: [] for k in variants}
    ratios: dict[str, list[float]] = {k: [] for k in variants if k != "predict"}
    names = list(variants)
    for r in range(args.rounds):
        got = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out = work / f"out-{r}-{name.replace(', ', '-').replace(' ', '')}.parquet"
            cmd = [c.replace("{out}", str(out)) for c in variants[name]]
            wall, busy, code, tail = timed(cmd, env)
            if code != 0:
                raise SystemExit(f"{name} failed (exit {code}): {tail}")
            got[name] = n / wall
            rates[name].append(got[name])
            others[name].append(busy)
        for name in ratios:
            ratios[name].append(got[name] / got["predict"])
        print(
            f"  round {r + 1}: "
            + ", ".join(f"{k} {v:.1f} img/s (others {others[k][-1]:.2f} cores)" for k, v in got.items()),
            flush=True,
        )
    print(
        f"  {'variant':<18} {'img/s (median)':>14}  {'spread over rounds':<22} {'per worker':>10} "
        f"{'others, cores':>14}"
    )
    for name in names:
        count = name.split(", ")[1].split()[0] if name != "predict" else "1"
        workers = (os.cpu_count() or 1) if count == "auto" else int(count)  # auto: one per core on a local Ray
        med = statistics.median(rates[name])
        print(
            f"  {name:<18} {med:>14.1f}  {spread(rates[name]):<22} {med / workers:>10.1f} "
            f"{statistics.median(others[name]):>14.2f}"
        )
    result = {}
    for name, values in ratios.items():
        ratio = statistics.median(values)
        busy = max(max(others[name]), max(others["predict"]))
        unreliable = busy > 0.25 * (os.cpu_count() or 1) or (max(values) - min(values)) > 0.15 * ratio
        print(
            f"  {name} / predict: {ratio:.2f} (spread {spread(values)}); other processes up to {busy:.2f} cores; "
            f"load average {loadavg()}"
            + ("\n  ! contention or spread high: this ratio is unreliable" if unreliable else "")
        )
        result[name] = {"ratio": ratio, "unreliable": unreliable}
    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ONNX Runtime intra-op threads in all")
    ap.add_argument(
        "--workers",
        type=lambda s: [v if v == "auto" else int(v) for v in s.split(",")],
        default=["auto", 1, 2],
        help="comma-separated worker counts; auto: batch-predict's defaults (default auto,1,2)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--models", default="vit-s16", help="comma-separated: vit-s16, vit-s16-emb, demo")
    args = ap.parse_args()

    import onnxruntime
    import ray

    print(
        f"cpu: {cpu_model()} ({os.cpu_count()} logical CPUs); onnxruntime {onnxruntime.__version__}, ray "
        f"{ray.__version__}; "
        f"load average {loadavg()}"
    )
    args.cache.mkdir(parents=True, exist_ok=True)
    images = collection(args.cache, args.images)
    results = {}
    makers = {"vit-s16": vit_small_artifacts, "vit-s16-emb": vit_small_embedding_artifacts, "demo": demo_artifacts}
    for model in args.models.split(","):
        results[model] = bench_model(LABELS[model], makers[model](args.cache), args, images, args.images)
    for model, target in TARGETS.items():
        judged = next((v for v in ("batch, auto worker", "batch, 1 worker") if v in results.get(model, {})), None)
        if judged is None:  # the defaults when measured, else one worker
            continue
        r = results[model][judged]
        print(
            f"\ntarget batch-predict >= {target}x predict for {LABELS[model]} on one machine: {r['ratio']:.2f} -> "
            f"{'MET' if r['ratio'] >= target else 'NOT MET'}" + (" (unreliable: see above)" if r["unreliable"] else "")
        )


if __name__ == "__main__":
    main()
