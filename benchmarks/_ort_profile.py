"""Where an ONNX Runtime graph's time goes, by op type (``bench_int8.py --profile``).

ONNX Runtime's own profiler (``enable_profiling``) times every node of every run; each node's median
over the runs is taken (another process interrupting one run moves a node's median little), and the
medians are summed by op type. Attention's two products in the INT8 graph (vitdeploy/export/int8_attention.py
names them) are told apart from the projections. The shares are what to read on a loaded machine; the
milliseconds are inflated by whatever other work took the cores.
"""

from __future__ import annotations

import collections
import json
import os
import tempfile

import numpy as np

PARTS = (("_scores", "attention Q·Kᵀ"), ("_context", "attention weights·V"))


def op_type_times(path: str, x: np.ndarray, threads: int, runs: int = 10, config=()) -> dict[str, float]:
    """Milliseconds per run by op type (the sum of each node's median), ``runs`` profiled runs after one warm-up."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="ort-profile-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "run")
        for key, value in config:
            so.add_session_config_entry(key, value)
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        for _ in range(runs + 1):
            session.run(None, feed)
        with open(session.end_profiling(), encoding="utf-8") as fh:
            events = json.load(fh)
    durations: dict[str, list[float]] = collections.defaultdict(list)
    kinds: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durations[e["name"]].append(e["dur"] / 1000.0)
            op = e["args"]["op_name"]
            kinds[e["name"]] = next((f"{op} ({label})" for key, label in PARTS if key in e["name"]), op)
    out: dict[str, float] = collections.Counter()
    for name, values in durations.items():
        out[kinds[name]] += float(np.median(values[1:] or values))  # the first run warms up
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def print_shares(title: str, columns: dict[str, dict[str, float]]) -> None:
    """One table: an op type a row, each profiled graph a column (its share, its ms)."""
    print(f"\n{title}")
    ops = list(dict.fromkeys(op for times in columns.values() for op in times))
    totals = {name: sum(times.values()) or 1.0 for name, times in columns.items()}
    print(f"{'op type':<42}" + "".join(f"{name:>24}" for name in columns))
    for op in ops:
        cells = "".join(
            f"{times.get(op, 0.0) / totals[name]:>12.1%} {times.get(op, 0.0):>8.2f} ms"
            for name, times in columns.items()
        )
        if any(times.get(op, 0.0) / totals[name] >= 0.001 for name, times in columns.items()):
            print(f"{op:<42}{cells}")
    print(f"{'sum of the node medians':<42}" + "".join(f"{'':>12} {t:>8.2f} ms" for t in totals.values()))
