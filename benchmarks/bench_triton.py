"""The generated Triton repository on the bundled tritonserver against the in-process Predictor.

The Triton side of ``bench_serve.py`` (same images, clients, artifacts, rounds and ratio; its
helpers are imported from there): 16 concurrent clients, one JPEG per request, ``tritonclient``
HTTP against the ensemble ``<name>`` (preprocess -> ``<name>_ort_python`` -> postprocess: the
``nvidia-pytriton`` server has the python backend only), whose ONNX Runtime uses the same
artifacts and the same intra-op threads as the in-process Predictor.

Variants, in rounds whose order rotates:

* ``in-process, 1/call``  ``Predictor.predict(jpeg_bytes)`` from each client thread;
* ``in-process, batched`` the Predictor over the same images in batches of ``--max-batch``;
* ``triton``              the ensemble on tritonserver (a subprocess of the .venv-triton environment).

Reported: images/s (median over rounds, spread), triton / best in-process, p50/p99 latency, the mean
dynamic batch size of the inference model (Triton's statistics: inferences / executions), the load
average before and after; a ratio is flagged when load or spread makes it unreliable.

    .venv/bin/python benchmarks/bench_triton.py                     # demo + ViT-S/16 (exported once)
    .venv/bin/python benchmarks/bench_triton.py --models demo --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import (  # noqa: E402  (the shared inputs, artifacts and timing of the serving benchmark)
    DEFAULT_CACHE, TARGET, concurrent, demo_artifacts, loadavg, pct, photos, spread, vit_small_artifacts,
)

from vitdeploy.bench import cpu_model  # noqa: E402


def inference_stats(client, model: str) -> tuple[int, int]:
    """(inferences, executions) of ``model`` so far: their ratio is the mean dynamic batch size."""
    stats = client.get_inference_statistics(model_name=model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def bench_model(label: str, artifacts: Path, args: argparse.Namespace, images: list[bytes]) -> dict[str, object]:
    import numpy as np
    import tritonclient.http as httpclient

    from vitdeploy.config import parse_config
    from vitdeploy.runtime.backends.base import BackendOptions
    from vitdeploy.runtime.predictor import Predictor
    from vitdeploy.serve.triton_local import BundledTriton, default_venv
    from vitdeploy.serve.triton_repo import build_triton_repo, settings_from_config

    n = args.requests_demo if "demo" in label else args.requests
    work = [images[i % len(images)] for i in range(n)]
    print(f"\n== {label}: {n} requests x {args.rounds} rounds, {args.clients} clients, {args.threads} ORT threads; "
          f"load average {loadavg()}", flush=True)
    predictor = Predictor.from_artifacts(artifacts, backend="ort", options=BackendOptions(threads=args.threads))
    cfg = parse_config({"triton": {"inference": "ort_python", "ort_threads": args.threads,
                                   "max_queue_delay_us": int(args.wait_ms * 1000), "decode_threads": args.decode_threads,
                                   "preprocess_instances": args.preprocess_instances, "max_queue_size": 0}})
    repo = build_triton_repo(artifacts, Path(tempfile.mkdtemp(prefix="bench-triton-")) / "repo",
                             settings_from_config(cfg))
    server = BundledTriton(default_venv(), repo.path, load=[repo.name]).start()
    print(f"  tritonserver {server.version} (nvidia-pytriton), ensemble {repo.name} over {repo.name}_ort_python",
          flush=True)
    stats_client = httpclient.InferenceServerClient(server.http_url)

    def via_triton(blob: bytes, client) -> None:
        data = np.array([[blob]], dtype=object)
        inp = httpclient.InferInput("IMAGES", [1, 1], "BYTES")
        inp.set_data_from_numpy(data, binary_data=True)
        client.infer(repo.name, [inp])

    def in_process(blob: bytes, _: object) -> None:
        predictor.predict(blob)

    def batched() -> tuple[float, list[float]]:
        lat = []
        start = time.perf_counter()
        for i in range(0, len(work), args.max_batch):
            t0 = time.perf_counter()
            chunk = work[i:i + args.max_batch]
            predictor.predict(chunk)
            lat.extend([time.perf_counter() - t0] * len(chunk))
        return len(work) / (time.perf_counter() - start), lat

    def triton() -> tuple[float, list[float]]:
        return concurrent(via_triton, work, args.clients, lambda: httpclient.InferenceServerClient(server.http_url))

    variants = {"in-process, 1/call": lambda: concurrent(in_process, work, args.clients), "in-process, batched": batched,
                "triton": triton}
    concurrent(in_process, work[:args.clients], args.clients)  # warm-up
    concurrent(via_triton, work[:args.clients * 2], args.clients, lambda: httpclient.InferenceServerClient(server.http_url))
    rates: dict[str, list[float]] = {k: [] for k in variants}
    lats: dict[str, list[float]] = {k: [] for k in variants}
    ratios: list[float] = []
    batch_means: list[float] = []
    names = list(variants)
    try:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            got = {}
            for name in order:
                before = inference_stats(stats_client, f"{repo.name}_ort_python") if name == "triton" else None
                rate, lat = variants[name]()
                got[name] = rate
                rates[name].append(rate)
                lats[name].extend(lat)
                if before is not None:
                    after = inference_stats(stats_client, f"{repo.name}_ort_python")
                    batch_means.append((after[0] - before[0]) / max(after[1] - before[1], 1))
            ratios.append(got["triton"] / max(got["in-process, 1/call"], got["in-process, batched"]))
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v:.1f} img/s" for k, v in got.items())
                  + f"; triton/best in-process {ratios[-1]:.2f}; mean batch {batch_means[-1]:.1f}", flush=True)
    finally:
        server.stop()
        predictor.close()
    print(f"  {'variant':<22} {'img/s (median)':>14}  {'spread over rounds':<24} {'p50 ms':>8} {'p99 ms':>8}")
    for name in names:
        print(f"  {name:<22} {statistics.median(rates[name]):>14.1f}  {spread(rates[name]):<24} "
              f"{pct(lats[name], 50):>8.1f} {pct(lats[name], 99):>8.1f}")
    ratio = statistics.median(ratios)
    print(f"  triton / best in-process: {ratio:.2f} (spread {spread(ratios)}); mean dynamic batch size "
          f"{statistics.median(batch_means):.1f} (spread {spread(batch_means)}); load average {loadavg()}")
    unreliable = os.getloadavg()[0] > (os.cpu_count() or 1) * 1.5 or (max(ratios) - min(ratios)) > 0.15 * ratio
    if unreliable:
        print("  ! load average or spread high: this ratio is unreliable on this machine now", flush=True)
    return {"ratio": ratio, "batch": statistics.median(batch_means), "unreliable": unreliable}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ONNX Runtime intra-op threads, both sides")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=192, help="requests per round for the ViT-S/16")
    ap.add_argument("--requests-demo", type=int, default=960, help="requests per round for the demo model")
    ap.add_argument("--max-batch", type=int, default=16, help="the in-process batch (Triton's is the export's max)")
    ap.add_argument("--wait-ms", type=float, default=10.0, help="triton.max_queue_delay_us in ms")
    ap.add_argument("--decode-threads", type=int, default=2, help="triton.decode_threads")
    ap.add_argument("--preprocess-instances", type=int, default=1, help="triton.preprocess_instances")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--models", default="vit-s16,demo", help="comma-separated: vit-s16, demo")
    args = ap.parse_args()

    import onnxruntime

    print(f"cpu: {cpu_model()} ({os.cpu_count()} logical CPUs); onnxruntime {onnxruntime.__version__}; "
          f"load average {loadavg()}")
    args.cache.mkdir(parents=True, exist_ok=True)
    images = photos()
    print(f"images: {len(images)} JPEG photos, {min(map(len, images)) // 1024}-{max(map(len, images)) // 1024} KB")
    results = {}
    for model in args.models.split(","):
        if model == "vit-s16":
            results[model] = bench_model("ViT-S/16 224, random weights", vit_small_artifacts(args.cache), args, images)
        elif model == "demo":
            results[model] = bench_model("demo model (32 px)", demo_artifacts(args.cache), args, images)
        else:
            raise SystemExit(f"unknown model {model!r} (vit-s16, demo)")
    if "vit-s16" in results:
        r = results["vit-s16"]
        verdict = "MET" if r["ratio"] >= TARGET else "NOT MET"
        print(f"\ntarget triton >= {TARGET}x in-process for ViT-S/16: {r['ratio']:.2f} -> {verdict}"
              + (" (unreliable: see above)" if r["unreliable"] else ""))


if __name__ == "__main__":
    main()
