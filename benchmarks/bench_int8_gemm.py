"""The INT8 GEMM ceiling on this CPU: ViT-B/16's matrix products alone, FP32 against every INT8 form
ONNX Runtime offers on x86 (issue 41: is 3.3x reachable with ONNX Runtime's kernels at all?).

Each (shape, form) is a one-node ONNX graph (plus the QuantizeLinear a form needs in front of it),
opened with ORT_ENABLE_ALL as ``ort-int8`` opens its graph (``session.qdqisint8allowed=1``), fed a
float [M, K] input, M = 197 * batch. Forms (``--forms``):

- ``fp32``: MatMul, what FP32 ``ort`` runs.
- ``qdq-pc``: Q(u8, per tensor) -> DQ -> MatMul <- DQ(s8, symmetric, per output channel): our graph's
  projections; ONNX Runtime fuses it to QuantizeLinear + MatMulIntegerToFloat. ``qdq-pt``: per-tensor weights.
- ``qdq-pc-qout``: the same with the output quantized again (Q -> DQ after the MatMul): QLinearMatMul.
- ``dynamic``: com.microsoft DynamicQuantizeMatMul (s8 per-channel weights, the activation's range
  computed per call over the whole batch: not batch-invariant).
- ``matmulinteger``: MatMulInteger fed u8 activations already quantized, int32 out: the integer kernel
  alone, no Quantize, no scaling (a lower bound on any static form, not a usable graph by itself).
- ``nbits8-bB``: com.microsoft MatMulNBits, bits=8, block_size B along K, accuracy_level 4 (the
  activation quantized to int8 per row and block inside the op, so row-local: batch-invariant).
  ``nbits8-bB-acc0``: accuracy_level 0 (the weights dequantized, float compute).

Every form's answer is compared with float64 ``X @ W`` on the timed input (relative error and the worst
row's cosine). Then the per-forward GEMM time of ViT-B/16 (model.ort.onnx's layout: q, k, v, out as four
768x768 products, the last block's q/out/MLP on the class token only, which is left out here: under 1%):
46 x (M,768,768) + 11 x (M,768,3072) + 11 x (M,3072,768), per form, and its ratio to FP32.

``--whole DIR`` (an export of ``bench_int8.py --model vit_base_patch16_224``: model.ort.onnx and
model.int8.onnx) also times both whole graphs in interleaved rounds and prints the ceiling arithmetic:
the float remainder of each graph (whole minus its GEMMs), and the end-to-end ratio each INT8 form
would give with that remainder: at ``--threads 1`` only. At more threads a one-node graph pays its thread pool's
wake-up (or, spinning, the pause between calls) and cold caches on every call, which the same product inside the
whole graph does not: its GEMM figures are then indicative only, and the whole graphs' ratio is what to read.

    .venv/bin/python benchmarks/bench_int8_gemm.py --threads 1 --cpu-time        # robust to other work
    .venv/bin/python benchmarks/bench_int8_gemm.py --threads 2 --whole DIR       # wall: read the contention
    .venv/bin/python benchmarks/bench_int8_gemm.py --threads 1 --cpu-time \\
        --whole /tmp/vitdeploy-bench-int8/vit_base_patch16_224-int8-speed      # + the ceiling arithmetic
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from _common import contention_since, environment, interleaved  # noqa: E402

from vitdeploy.evaluate.reliability import sample  # noqa: E402

TOKENS = 197  # ViT-B/16 at 224 px: 196 patches + the class token
#: (name, K, N, products per ViT-B/16 forward in model.ort.onnx at M = 197 * batch)
SHAPES = (("qkvo 768x768", 768, 768, 46), ("fc1 768x3072", 768, 3072, 11), ("fc2 3072x768", 3072, 768, 11))
QKV_FUSED = ("qkv 768x2304", 768, 2304, 0)  # --fused-qkv: one product for q, k and v (not our graph's layout)
FORMS = ("fp32", "qdq-pc", "qdq-pt", "qdq-pc-qout", "dynamic", "matmulinteger", "nbits8-b32", "nbits8-b128")
TARGETS = {1: 3.3, 8: 3.0}
INT8_CONFIG = (("session.qdqisint8allowed", "1"),)  # as ort-int8 opens model.int8.onnx
NO_SPIN = (("session.intra_op.allow_spinning", "0"), ("session.inter_op.allow_spinning", "0"))


def _model(nodes, inputs, output, inits):
    from onnx import TensorProto, helper

    out = helper.make_tensor_value_info(output, TensorProto.FLOAT if output != "yi" else TensorProto.INT32, None)
    graph = helper.make_graph(nodes, "gemm", inputs, [out], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _quant_weights(w: np.ndarray, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    amax = np.abs(w).max(axis=0) if per_channel else np.abs(w).max(keepdims=True)
    scale = (amax / 127.0).astype(np.float32)
    return np.clip(np.round(w / scale), -127, 127).astype(np.int8), scale


def _act_quant(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """u8 asymmetric per tensor from the input's own range (MinMax calibration on the timed input)."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((hi - lo) / 255.0)
    return scale, np.uint8(np.clip(round(-lo / scale), 0, 255))


def build(form: str, x: np.ndarray, w: np.ndarray):
    """(the ONNX model of ``form`` for ``x @ w``, its feed)."""
    from onnx import TensorProto, helper, numpy_helper

    m, k = x.shape
    n = w.shape[1]
    t = numpy_helper.from_array
    x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])
    if form == "fp32":
        return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x_in], "y", [t(w, "w")]), {"x": x}
    if form.startswith("nbits8"):
        return _nbits(form, x, w)
    wq, ws = _quant_weights(w, per_channel=form != "qdq-pt")
    xs, xz = _act_quant(x)
    if form == "dynamic":
        inits = [t(wq, "wq"), t(ws, "ws"), t(np.zeros_like(ws, np.int8), "wz")]
        node = helper.make_node("DynamicQuantizeMatMul", ["x", "wq", "ws", "wz"], ["y"], domain="com.microsoft")
        return _model([node], [x_in], "y", inits), {"x": x}
    if form == "matmulinteger":
        xq = np.clip(np.round(x / xs) + xz, 0, 255).astype(np.uint8)
        inits = [t(wq, "wq"), t(np.array(xz), "xz"), t(np.zeros(n, np.int8), "wz")]
        node = helper.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["yi"])
        return _model([node], [helper.make_tensor_value_info("xq", TensorProto.UINT8, [m, k])], "yi", inits), {
            "xq": xq
        }
    axis = {"axis": 1} if form != "qdq-pt" else {}
    inits = [
        t(wq, "wq"),
        t(ws if form != "qdq-pt" else ws.reshape(()), "ws"),
        t(np.zeros(ws.shape if form != "qdq-pt" else (), np.int8), "wz"),
        t(np.array(xs), "xs"),
        t(np.array(xz), "xz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], **axis),
        helper.make_node("MatMul", ["xd", "wd"], ["y" if form != "qdq-pc-qout" else "yf"]),
    ]
    if form == "qdq-pc-qout":
        y = x.astype(np.float64) @ w.astype(np.float64)
        ys, yz = _act_quant(y)
        inits += [t(np.array(ys), "ys"), t(np.array(yz), "yz")]
        nodes += [
            helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["yq"]),
            helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
        ]
    return _model(nodes, [x_in], "y", inits), {"x": x}


def _nbits(form: str, x: np.ndarray, w: np.ndarray):
    """MatMulNBits, 8 bits, asymmetric u8 per (output channel, block of K), accuracy_level 4 or 0."""
    from onnx import TensorProto, helper, numpy_helper

    block = int(form.split("-b")[1].split("-")[0])
    level = 0 if form.endswith("-acc0") else 4
    k, n = w.shape
    blocks = w.T.reshape(n, k // block, block)
    lo, hi = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    scale = ((hi - lo) / 255.0).astype(np.float32)
    zero = np.clip(np.round(-lo / scale), 0, 255).astype(np.uint8)
    q = np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, 255).astype(np.uint8)
    t = numpy_helper.from_array
    inits = [t(q, "wq"), t(scale.reshape(-1), "ws"), t(zero.reshape(-1), "wz")]
    node = helper.make_node(
        "MatMulNBits",
        ["x", "wq", "ws", "wz"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=8,
        block_size=block,
        accuracy_level=level,
    )
    x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    return _model([node], [x_in], "y", inits), {"x": x}


def session(model, threads: int, optimized: Path | None = None, config=INT8_CONFIG):
    """An ORT_ENABLE_ALL CPU session of ``model`` (an ONNX model, or a path), ORT's defaults otherwise."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    for key, value in config:
        so.add_session_config_entry(key, value)
    if optimized is not None:
        so.optimized_model_filepath = str(optimized)
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def fused_ops(path: Path) -> str:
    """The op types ONNX Runtime runs after its fusions (from the optimized model it wrote)."""
    import onnx

    return "+".join(n.op_type for n in onnx.load(str(path)).graph.node)


def error(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    cos = np.sum(got * ref, -1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1))
    return {"rel_err": rel, "min_cos": float(cos.min())}


def open_forms(forms, shapes, batch: int, threads: int, rng, tmp: Path, spin: bool) -> tuple[dict, dict]:
    """({(shape, form): a call}, {(shape, form): its fused op types and error}) for one batch."""
    calls, info = {}, {}
    for name, k, n, _ in shapes:
        # activations like a LayerNorm output (a few wide channels), weights like a trained ViT's
        x = rng.standard_normal((TOKENS * batch, k)).astype(np.float32)
        x[:, rng.choice(k, 4, replace=False)] *= 8.0
        w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
        ref = x.astype(np.float64) @ w.astype(np.float64)
        for form in forms:
            model, feed = build(form, x, w)
            opt = tmp / f"{name.split()[0]}-{form}-{batch}.onnx"
            sess = session(model, threads, opt, config=INT8_CONFIG + (() if spin else NO_SPIN))
            got = sess.run(None, feed)[0].astype(np.float64)
            if form == "matmulinteger":  # int32 out: (xq - xz) @ wq, rescaled here by xs * ws to judge it
                got = got * _act_quant(x)[0] * _quant_weights(w, True)[1]
            calls[name, form] = lambda s=sess, f=feed: s.run(None, f)
            info[name, form] = {"ops": fused_ops(opt), **error(ref, got)}
    return calls, info


def gemm_table(batch: int, forms, shapes, timings, info) -> dict[str, float]:
    """Print one batch's table (a row per shape and form); the per-forward GEMM ms of each form."""
    from vitdeploy.evaluate.reliability import SPREAD_LIMIT

    print(f"\nbatch {batch} (M = {TOKENS * batch})")
    print(
        f"{'shape':<14} {'form':<18} {'p50 ms':>8} {'p90/p50':>8} {'vs fp32':>8} {'rel err':>8} {'min cos':>9}"
        "  runs as"
    )
    for name, *_ in shapes:
        base = timings.median((name, "fp32"))
        for form in forms:
            key = (name, form)
            p50, spread = timings.median(key), timings.p90(key) / timings.median(key)
            flag = " *" if spread > SPREAD_LIMIT else ""
            print(
                f"{name:<14} {form:<18} {p50:>8.3f} {spread:>8.2f} {base / p50:>7.2f}x {info[key]['rel_err']:>8.4f} "
                f"{info[key]['min_cos']:>9.5f}  {info[key]['ops']}{flag}"
            )
    per_forward = {f: sum(c * timings.median((n, f)) for n, _, _, c in shapes if c) for f in forms}
    print(
        "per ViT-B/16 forward (46 x qkvo + 11 x fc1 + 11 x fc2): "
        + ", ".join(f"{f} {ms:.1f} ms ({per_forward['fp32'] / ms:.2f}x)" for f, ms in per_forward.items())
    )
    return per_forward


def whole_graphs(export_dir: Path, batches, threads: int, spin: bool, clock, **timing) -> dict[int, dict]:
    """model.ort.onnx (FP32 ``ort``) and model.int8.onnx (``ort-int8``) timed in interleaved rounds."""
    extra = () if spin else NO_SPIN
    sessions = {
        "ort": session(export_dir / "model.ort.onnx", threads, config=extra),
        "ort-int8": session(export_dir / "model.int8.onnx", threads, config=INT8_CONFIG + extra),
    }
    name = sessions["ort"].get_inputs()[0].name
    out = {}
    for batch in batches:
        x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        fns = {k: (lambda s=s: s.run(None, {name: x})) for k, s in sessions.items()}
        phase = sample()
        t = interleaved(fns, seed=batch, clock=clock, **timing)
        out[batch] = {k: {"p50_ms": t.median(k), "spread": t.p90(k) / t.median(k)} for k in sessions}
        out[batch]["contention"] = contention_since(phase)
    return out


def ceiling(batch: int, whole: dict, per_forward: dict[str, float], threads: int) -> dict[str, float]:
    """The end-to-end ratio each form would give, the INT8 graph's float remainder kept as measured (one thread
    only: at more, a one-node graph pays its pool's wake-up and cold caches on every call, which a node inside
    the whole graph does not, so whole minus GEMMs means nothing)."""
    t_fp, t_i8 = whole["ort"]["p50_ms"], whole["ort-int8"]["p50_ms"]
    rest_fp, rest_i8 = t_fp - per_forward["fp32"], t_i8 - per_forward["qdq-pc"]
    print(
        f"\nbatch {batch}, whole graphs: ort {t_fp:.1f} ms (p90/p50 {whole['ort']['spread']:.2f}), ort-int8 "
        f"{t_i8:.1f} ms (p90/p50 {whole['ort-int8']['spread']:.2f}): {t_fp / t_i8:.2f}x "
        f"(target {TARGETS.get(batch)}x); "
        f"{whole['contention']}"
    )
    if threads > 1:
        print("  (the arithmetic is left out at more than one thread: run it with --threads 1 --cpu-time)")
        return {}
    print(
        f"  GEMMs: fp32 {per_forward['fp32']:.1f} ms = {per_forward['fp32'] / t_fp:.0%} of ort; qdq-pc "
        f"{per_forward['qdq-pc']:.1f} ms = {per_forward['qdq-pc'] / t_i8:.0%} of ort-int8; remainder (whole - GEMMs): "
        f"ort {rest_fp:.1f} ms, ort-int8 {rest_i8:.1f} ms"
    )
    target = TARGETS.get(batch, 3.0)
    out = {}
    for form, ms in per_forward.items():
        if form == "fp32":
            continue
        est, bound = t_fp / (rest_i8 + ms), t_fp / ms
        room = t_fp / target - ms
        out[form] = est
        print(
            f"  {form:<18} GEMMs {ms:>6.1f} ms: end to end {est:.2f}x with ort-int8's remainder, {bound:.2f}x with "
            f"no remainder; {target}x needs the remainder <= {room:.1f} ms (it is {rest_i8 / room:.2f}x that)"
            if room > 0
            else f"  {form:<18} GEMMs {ms:>6.1f} ms: {target}x out of reach even with no remainder ({bound:.2f}x)"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu-time", action="store_true", help="time process CPU time (with --threads 1)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument(
        "--forms", default=",".join(FORMS), help=f"comma-separated, of {', '.join(FORMS)}, nbits8-bB[-acc0]"
    )
    ap.add_argument("--fused-qkv", action="store_true", help="also time q, k, v as one 768x2304 product")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--whole", type=Path, help="an export dir with model.ort.onnx + model.int8.onnx (ViT-B/16)")
    ap.add_argument("--whole-iters", type=int, default=10)
    ap.add_argument(
        "--spin",
        choices=("auto", "on", "off"),
        default="auto",
        help="ONNX Runtime's spinning threads; auto: as OrtBackend (off when the threads take every usable core)",
    )
    ap.add_argument(
        "--gap-ms",
        type=float,
        help="sleep before each timed call (default: 50 with spinning threads, so the previous session's stop "
        "spinning, else 0)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time counts the process's CPU time: use it with --threads 1")
    from vitdeploy.evaluate.reliability import busy_machine_reason, contention, usable_cores

    forms = ["fp32", *(f for f in args.forms.split(",") if f != "fp32")]
    shapes = SHAPES + ((QKV_FUSED,) if args.fused_qkv else ())
    batches = [int(b) for b in args.batch_sizes.split(",")]
    clock = time.process_time if args.cpu_time else time.perf_counter
    spin = args.threads > 1 and (args.spin == "on" or (args.spin == "auto" and args.threads < usable_cores()))
    gap = (args.gap_ms if args.gap_ms is not None else 50.0 if spin else 0.0) / 1000.0
    env = environment(args.threads)
    print(f"cpu: {env['cpu']} flags {env['cpu_flags']}, {usable_cores()} usable cores, {args.threads} thread(s)")
    print(
        f"versions: {env['versions']}; clock: {'process CPU time' if args.cpu_time else 'wall'}"
        + (f"; spinning {'on' if spin else 'off'}, {gap * 1000:.0f} ms before each call" if args.threads > 1 else "")
    )
    result: dict = {"env": env, "clock": "cpu" if args.cpu_time else "wall", "spin": spin, "gap_s": gap, "batches": {}}
    rng, before = np.random.default_rng(0), sample()
    with tempfile.TemporaryDirectory(prefix="gemm-") as tmp:
        for batch in batches:
            calls, info = open_forms(forms, shapes, batch, args.threads, rng, Path(tmp), spin)
            phase = sample()
            timings = interleaved(calls, warmup=args.warmup, iters=args.iters, seed=batch, clock=clock, gap_s=gap)
            per_forward = gemm_table(batch, forms, shapes, timings, info)
            print(f"  contention while batch {batch}'s GEMMs were timed: {contention_since(phase)}")
            rows = [{"shape": n, "form": f, "p50_ms": timings.median((n, f)), **info[n, f]} for n, f in calls]
            result["batches"][batch] = {"rows": rows, "per_forward_ms": per_forward}
            del calls
    if args.whole:
        whole = whole_graphs(
            args.whole, batches, args.threads, spin, clock, warmup=2, iters=args.whole_iters, gap_s=gap
        )
        for batch in batches:
            per_forward = result["batches"][batch]["per_forward_ms"]
            result["batches"][batch].update(
                whole=whole[batch], ceiling=ceiling(batch, whole[batch], per_forward, args.threads)
            )
    window = contention(before, sample(), usable_cores())
    busy = busy_machine_reason(window, args.threads)
    print(
        f"\ncontention while timed: {window.describe() if window else 'unknown'}"
        + (f" -> BUSY: {busy}" if busy else "")
    )
    print("p90/p50 above the spread limit: marked *. rel err / min cos: against float64 x @ w on the timed input.")
    result.update(contention=window.to_dict() if window else None, busy=busy)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
