"""The OpenVINO backends against ONNX Runtime's, batch 1 and 8 (issue 51): `openvino` vs `ort`, `openvino-int8` vs
`ort-int8`, `openvino-bf16` vs `ort`, on a random-weight export (bench_int8.py's: every MatMul/Gemm INT8, no
gates, cached), every variant through vitdeploy's own backends, interleaved round-robin in one process.

Beside them, the two questions the backend's design rests on:

- ``openvino-static``: model.onnx compiled at a static shape per batch size (benchmarks/_openvino.py's runner,
  OpenVINO's best case) against the backend's one compile with a bounded dynamic batch;
- ``--ep DIR``: ONNX Runtime's OpenVINO execution provider (the ``onnxruntime-ep-openvino`` plugin, unpacked in
  DIR: never installed into the project's venv) on the same graphs, where the plugin offers a device here.

Then what ``auto`` chooses on this machine (its own short measurement at batch 1) against the fastest gated
variant here, and the BF16 verdict the export recorded (validate-bf16). Load average printed before and after.

    .venv/bin/python benchmarks/bench_openvino.py --model vit_base_patch16_224 --ep /tmp/ep-openvino
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
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import drift, environment, interleaved, version  # noqa: E402

#: the comparisons the issue asks for: (variant, its ONNX Runtime counterpart)
PAIRS = (("openvino", "ort"), ("openvino-int8", "ort-int8"), ("openvino-bf16", "ort"), ("openvino-static", "openvino"))


def open_backends(out: Path, threads: int) -> tuple[dict, list[str]]:
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends import BackendOptions, open_or_reason

    artifacts = Artifacts.open(out)
    opts = BackendOptions(device="cpu", providers=("CPUExecutionProvider",), threads=threads)
    backends, notes = {}, []
    for name in ("torch", "ort", "ort-int8", "openvino", "openvino-int8", "openvino-bf16"):
        opened = open_or_reason(name, artifacts, opts)
        if opened.ok:
            backends[name] = opened.backend
        else:
            notes.append(f"{name}: {opened.status} ({opened.reason})")
    return backends, notes


def add_static(out: Path, backends: dict, threads: int, chw: tuple[int, ...]) -> None:
    """``openvino-static``: model.onnx at f32, compiled per batch size (threads not pinned, as the backend)."""
    import _openvino
    import openvino as ov

    core = ov.Core()
    config = {
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": "1",
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": "f32",
        "ENABLE_CPU_PINNING": False,
    }
    model = core.read_model(str(out / "model.onnx"))
    backends["openvino-static"] = _openvino.OvRunner(core, model, "openvino-static", config, chw)


class EpSession:
    """An ONNX Runtime session on the OpenVINO EP plugin's CPU device."""

    def __init__(self, session, name: str) -> None:
        self.session, self.name = session, name
        self.input = session.get_inputs()[0].name

    def run(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: batch})[0]

    def close(self) -> None:
        self.session = None


def add_ep(ep_dir: Path, out: Path, backends: dict, threads: int) -> str:
    """``ep-openvino`` / ``ep-openvino-int8`` where the plugin offers a CPU device here; one line says what it did."""
    import onnxruntime as ort

    sys.path.insert(0, str(ep_dir))
    import onnxruntime_ep_openvino as plugin

    ort.register_execution_provider_library("openvino_ep", plugin.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == plugin.get_ep_name()]
    cpu = [d for d in devices if d.ep_metadata.get("ov_device") == "CPU"]
    seen = [(d.ep_name, d.device.vendor, hex(d.device.vendor_id)) for d in ort.get_ep_devices()]
    if not cpu:
        return (
            f"onnxruntime-ep-openvino (unpacked in {ep_dir}) registered, but it offers no OpenVINO device here "
            f"(ONNX Runtime's devices: {seen}): the EP cannot run on this CPU"
        )
    for name, graph in (("ep-openvino", "model.onnx"), ("ep-openvino-int8", "model.int8.onnx")):
        so = ort.SessionOptions()
        so.add_provider_for_devices(cpu, {"precision": "FP32", "num_of_threads": str(threads)})
        backends[name] = EpSession(ort.InferenceSession(str(out / graph), sess_options=so), name)
    return f"OpenVINO EP devices: {seen}"


def time_variants(backends: dict, batches: list[int], args: argparse.Namespace) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for batch in batches:
        x = rng.standard_normal((batch, *backends["ort"].input_shape)).astype(np.float32)
        ref = backends["torch"].run(x)
        for b in backends.values():
            if hasattr(b, "prepare"):
                b.prepare(batch)
        fns = {name: (lambda b=b: b.run(x)) for name, b in backends.items() if name != "torch"}
        timings = interleaved(fns, warmup=args.warmup, iters=args.iters, seed=batch)
        for name in fns:
            p50, p90 = timings.median(name), timings.p90(name)
            row = {"batch": batch, "variant": name, "p50_ms": p50, "spread": p90 / p50, **drift(ref, fns[name]())}
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    by = {(r["batch"], r["variant"]): r for r in rows}
    print(f"\n{'batch':>5} {'variant':<18} {'p50 ms':>9} {'p90/p50':>8} {'max|diff|':>10} {'top1':>6}")
    for r in rows:
        print(
            f"{r['batch']:>5} {r['variant']:<18} {r['p50_ms']:>9.1f} {r['spread']:>8.2f} {r['max_abs_diff']:>10.3g} "
            f"{r['top1_agreement']:>6.2f}"
        )
    print("\nspeed of each variant against its counterpart (counterpart p50 / variant p50; > 1: faster):")
    for batch in sorted({r["batch"] for r in rows}):
        for variant, base in PAIRS + (("ep-openvino", "openvino"), ("ep-openvino-int8", "openvino-int8")):
            if (batch, variant) in by and (batch, base) in by:
                ratio = by[batch, base]["p50_ms"] / by[batch, variant]["p50_ms"]
                print(f"  batch {batch}: {variant} vs {base}: {ratio:.2f}x")


def auto_check(out: Path, threads: int, rows: list[dict]) -> dict:
    """What auto chooses here (its own measurement, kept beside the export) against the fastest gated variant."""
    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.auto_choice import cache_path, cpu_candidates, gate_refusal
    from vitdeploy.runtime.backends import BackendOptions
    from vitdeploy.runtime.predictor import select_backend

    artifacts = Artifacts.open(out)
    cache_path(out).unlink(missing_ok=True)  # measure now, on this machine
    backend, name, why = select_backend(artifacts, BackendOptions(threads=threads))
    backend.close()
    timed = {r["variant"]: r["p50_ms"] for r in rows if r["batch"] == 1 and r["variant"] in cpu_candidates()}
    gated = {n: v for n, v in timed.items() if gate_refusal(n, artifacts) is None}
    fastest = min(gated, key=gated.get)
    slower = timed[name] / gated[fastest] - 1
    print(f"\nauto chose {name}: {why}")
    print(
        f"  in the rounds above at batch 1: {name} {timed[name]:.1f} ms, the fastest gated {fastest} "
        f"{gated[fastest]:.1f} ms: {100 * slower:+.1f}% (goal: <= +5%)"
    )
    return {"chosen": name, "why": why, "fastest": fastest, "slower_by": slower}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--ep", type=Path, help="a folder holding the unpacked onnxruntime-ep-openvino wheel")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "vitdeploy-bench-int8")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from bench_int8 import export

    from vitdeploy.evaluate.reliability import busy_machine_reason, contention, sample, usable_cores

    print(f"load average before: {os.getloadavg()}", flush=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    out = export(args.model, args.cache)
    backends, notes = open_backends(out, args.threads)
    add_static(out, backends, args.threads, backends["ort"].input_shape)
    if args.ep:
        notes.append(add_ep(args.ep, out, backends, args.threads))
    env = {**environment(args.threads), "openvino": version("openvino")}
    print(f"cpu: {env['cpu']} flags {env['cpu_flags']}, {usable_cores()} usable cores, {args.threads} threads")
    print(f"versions: {env['versions']}, openvino {env['openvino']}")
    for note in notes:
        print(note)
    verdict = json.loads((out / "manifest.json").read_text())["validation"].get("validate-bf16")
    if verdict:
        m = verdict["metrics"]
        print(
            f"validate-bf16 (the export's, random weights, {sum(verdict.get('rows_per_batch', {}).values())} runs): "
            f"passed {verdict['passed']}, max|diff| {m['max_abs_diff']:.3g}, min cosine {m['cosine']:.6f}, "
            f"top-1 {m['top1_agreement']:.2%}"
        )
    before = sample()
    start = time.time()
    rows = time_variants(backends, [int(b) for b in args.batch_sizes.split(",")], args)
    window = contention(before, sample(), usable_cores())
    print(f"\ntimed in {time.time() - start:.0f} s; contention: {window.describe() if window else 'unknown'}")
    busy = busy_machine_reason(window, args.threads)
    if busy:
        print(f"BUSY: {busy}: ratios unreliable")
    print_table(rows)
    for b in backends.values():
        b.close()
    auto = auto_check(out, args.threads, rows)
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"env": env, "rows": rows, "auto": auto, "notes": notes}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
