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

Sizing the CPU of a GPU deployment: the python preprocessing model (``<name>_preprocess``: decode +
resize + normalise, in its own ``triton_python_backend_stub`` process per instance) is measured
after the rounds over one more pass of the requests: the CPU seconds its stub processes used
(user + system, from /proc, all its threads) per request, and the cores that makes per 1,000
images/s (= ms of CPU per image); beside it Triton's own compute time of that model per request
(wall time, decoding threads overlapping). The images are the same JPEG photos, so the figure is
per image of that size; on a GPU the inference model leaves this CPU cost unchanged.

    .venv/bin/python benchmarks/bench_triton.py                     # demo + ViT-S/16 (exported once)
    .venv/bin/python benchmarks/bench_triton.py --models demo --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve_kit import (
    common_arguments,
    compare_rounds,
    concurrent,
    in_process_variants,
    loadavg,
    run_models,
    tree_pids,
)  # noqa: E402  (the shared inputs, artifacts and timing of the serving benchmark)


def inference_stats(url: str, model: str) -> tuple[int, int]:
    """(inferences, executions) of ``model`` so far (`vitdeploy loadtest`'s reading of the server's statistics):
    their ratio is the mean dynamic batch size."""
    from vitdeploy.client.protocols import V2_HTTP, Target
    from vitdeploy.client.server_stats import read

    stats = read(Target(url, V2_HTTP, model)) or {}
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def _children(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = [c for c, p in parents.items() if p == pid]
        found += kids
        todo += kids
    return found


def stub_cpu_seconds(server_pid: int, model: str) -> float:
    """CPU seconds (user + system, all threads) used so far by the python backend stubs of ``model``."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in _children(server_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if f"/{model}/" not in cmdline or "triton_python_backend_stub" not in cmdline:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total


def preprocess_cost(server, model: str, run, requests: int) -> dict[str, float]:
    """CPU and Triton compute time of the preprocessing model per request over one pass of ``run`` (the compute
    time from the server's statistics, as `vitdeploy loadtest` reads them)."""
    from vitdeploy.client.protocols import V2_HTTP, Target
    from vitdeploy.client.server_stats import delta, read

    target = Target(server.http_url, V2_HTTP, model)
    cpu0, before = stub_cpu_seconds(server.process.pid, model), read(target)
    run()
    cpu1, after = stub_cpu_seconds(server.process.pid, model), read(target)
    spent = delta(before, after) or {}
    cpu_ms = (cpu1 - cpu0) * 1000.0 / max(requests, 1)
    out = {
        "preprocess_cpu_ms_per_request": cpu_ms,
        "preprocess_cores_per_1000_img_s": cpu_ms,
        "preprocess_triton_compute_ms_per_request": sum(
            spent.get(f"{phase}_ms") or 0.0 for phase in ("compute_input", "compute_infer", "compute_output")
        ),
    }
    print(
        f"  {model}: {cpu_ms:.2f} ms CPU per request (decode + preprocess, 1 image each) -> "
        f"{cpu_ms:.1f} cores per 1,000 images/s; Triton compute time "
        f"{out['preprocess_triton_compute_ms_per_request']:.2f} "
        f"ms per request",
        flush=True,
    )
    return out


def bench_model(label: str, artifacts: Path, args: argparse.Namespace, images: list[bytes]) -> dict[str, object]:
    import numpy as np
    import tritonclient.http as httpclient

    from vitdeploy.base.config import parse_config
    from vitdeploy.runtime.backends.base import BackendOptions
    from vitdeploy.runtime.predictor import Predictor
    from vitdeploy.serve.triton.local import BundledTriton, default_venv
    from vitdeploy.serve.triton.repo import build_triton_repo, settings_from_config

    n = args.requests_demo if "demo" in label else args.requests
    work = [images[i % len(images)] for i in range(n)]
    print(
        f"\n== {label}: {n} requests x {args.rounds} rounds, {args.clients} clients, {args.threads} ORT threads; "
        f"load average {loadavg()}",
        flush=True,
    )
    predictor = Predictor.from_artifacts(artifacts, backend="ort", options=BackendOptions(threads=args.threads))
    cfg = parse_config(
        {
            "triton": {
                "inference": "ort_python",
                "ort_threads": args.threads,
                "max_queue_delay_us": int(args.wait_ms * 1000),
                "decode_threads": args.decode_threads,
                "preprocess_instances": args.preprocess_instances,
                "max_queue_size": 0,
            }
        }
    )
    repo = build_triton_repo(
        artifacts, Path(tempfile.mkdtemp(prefix="bench-triton-")) / "repo", settings_from_config(cfg)
    )
    server = BundledTriton(default_venv(), repo.path, load=[repo.name]).start()
    print(
        f"  tritonserver {server.version} (nvidia-pytriton), ensemble {repo.name} over {repo.name}_ort_python",
        flush=True,
    )

    def via_triton(blob: bytes, client) -> None:
        data = np.array([[blob]], dtype=object)
        inp = httpclient.InferInput("IMAGES", [1, 1], "BYTES")
        inp.set_data_from_numpy(data, binary_data=True)
        client.infer(repo.name, [inp])

    def triton() -> tuple[float, list[float]]:
        return concurrent(via_triton, work, args.clients, lambda: httpclient.InferenceServerClient(server.http_url))

    try:
        variants = in_process_variants(predictor, work, args)
        concurrent(
            via_triton,
            work[: args.clients * 2],
            args.clients,  # warm-up
            lambda: httpclient.InferenceServerClient(server.http_url),
        )
        result = compare_rounds(
            "triton",
            {**variants, "triton": triton},
            args.rounds,
            probe=lambda: inference_stats(server.http_url, f"{repo.name}_ort_python"),
            mean_batch=lambda before, after: (after[0] - before[0]) / max(after[1] - before[1], 1),
            # the server's tree (tritonserver and its python stubs) is the benchmark's own work, not contention
            own_pids=lambda: tree_pids([server.process.pid]) if server.process is not None else [],
        )
        result.update(preprocess_cost(server, f"{repo.name}_preprocess", triton, len(work)))
        return result
    finally:
        server.stop()
        predictor.close()
        shutil.rmtree(repo.path.parent, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_arguments(ap)
    ap.add_argument("--max-batch", type=int, default=16, help="the in-process batch (Triton's is the export's max)")
    ap.add_argument("--decode-threads", type=int, default=2, help="triton.decode_threads")
    ap.add_argument("--preprocess-instances", type=int, default=1, help="triton.preprocess_instances")
    args = ap.parse_args()

    import onnxruntime

    run_models("triton", args, f"onnxruntime {onnxruntime.__version__}", bench_model)


if __name__ == "__main__":
    main()
