"""Backend "auto" on the CPU: the fastest backend here among those whose artifact passed its gate, measured once
per machine and kept beside the export.

The Predictor's auto-selection (predict, serve, batch-predict) runs, in order:

1. an accelerator first, as before (runtime/predictor.py): trt, then ort-fp16 on a CUDA provider;
2. else the CPU candidates (:func:`cpu_candidates`: every runtime backend of the vocabulary that runs on the
   CPU but torch, the reference and last resort, and ort-fp16, which has no FP16 kernels there) that can run
   here and passed their gate (:func:`gate_refusal`: the artifact is listed, and a verdict of its own passed
   where the backend has one: openvino-bf16's ``validate-bf16``); one candidate is chosen as it is; among
   several, the fastest at batch 1, from the first of:

   - ``auto-backend.json`` beside the export (else in the user's cache), its entry for this CPU (model and
     flags, :func:`~vitdeploy.base.machine.cpu_key`) made for this export, thread count, candidates and
     library versions;
   - `vitdeploy bench`'s ``bench-report.json`` beside the export, when it was taken on this CPU with these
     threads, timed every candidate at batch 1 and is newer than the entry;
   - a short measurement now (:func:`tournament`): the best so far against the next candidate, the two
     interleaved, each call's wall time, their medians; only two backends open at a time. Saved for the
     next load; a process that finds another measuring waits for its figures (a lock beside the file).

   Of the backends within :data:`TIE` (3%) of the fastest, the most precise wins (fp32, then bf16, then
   int8): a lower precision is chosen only for a speed it buys, and the choice is never more than 3% slower
   than the fastest measured.
3. else torch (eager PyTorch), as before.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..base._deps import available
from ..base._files import write_json_atomic
from ..base.machine import cpu_key, cpu_model
from ..base.vocab import AUTO_CHOICE_NAME, BACKEND_KINDS, BACKENDS, BENCH_REPORT_NAME, ORT_FP16, TORCH
from .local_cache import user_cache_dir, writable_dir

log = logging.getLogger(__name__)

FORMAT = "vitdeploy-auto-backend"
TIE = 0.03  # speeds within 3% of each other: the more precise backend wins
#: the more precise first: what a tie goes to
PRECISION_RANK = {"fp32": 0, "bf16": 1, "fp16": 1, "int8": 2}
#: a measurement: at least / at most this many interleaved rounds per pair, more only within the budget
ROUNDS = (3, 9)
PAIR_BUDGET_S = 2.0

#: ``timer(name, call) -> seconds``: how one call is timed (tests give a deterministic one)
Timer = Callable[[str, Callable[[], Any]], float]


def cpu_candidates() -> tuple[str, ...]:
    """The backends auto weighs on the CPU, in the vocabulary's order (``ort`` first: the default runtime)."""
    return tuple(
        k.name for k in BACKENDS if k.runs == k.name and k.device != "cuda" and k.name not in (TORCH, ORT_FP16)
    )


def gate_refusal(name: str, artifacts: Any) -> str | None:
    """Why ``name`` has not passed its gate for this export (one line), or None. Its artifact being listed in
    the manifest is the gate of most backends (the export lists only what passed its validation); a backend
    whose gate is a verdict of its own (vocab ``BackendKind.gate``) needs that verdict, passed."""
    gate = BACKEND_KINDS[name].gate
    if gate is None:
        return None
    verdict = (artifacts.manifest.get("validation") or {}).get(gate)
    if verdict is None:
        return f"the export has no {gate} verdict (exported where {name} could not run)"
    if verdict.get("passed") is not True:
        return f"missed its gate ({gate})"
    return None


def _wall(name: str, call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def fastest(ms: Mapping[str, float], order: Sequence[str] = ()) -> str:
    """The winner among ``ms`` (each backend's batch-1 time): of those within :data:`TIE` of the fastest, the
    most precise, then the faster (then the earlier in ``order``). So it is never more than TIE slower than
    the fastest, and a lower precision is chosen only for a speed it buys."""
    floor = min(ms.values())
    close = [n for n in ms if ms[n] <= floor * (1 + TIE)]
    rank = {n: i for i, n in enumerate(order)}
    return min(close, key=lambda n: (PRECISION_RANK[BACKEND_KINDS[n].precision], ms[n], rank.get(n, len(rank))))


def time_pair(backends: Mapping[str, Any], batch: np.ndarray, timer: Timer = _wall) -> dict[str, float]:
    """Two (or more) open backends timed on ``batch``, interleaved (the order alternates each round, so load
    from elsewhere falls on them alike): one warm-up call each, then :data:`ROUNDS` rounds within
    :data:`PAIR_BUDGET_S`; each one's median call, in ms."""
    names = list(backends)
    for name in names:
        backends[name].run(batch)  # warm-up: first-call allocations, lazy kernels
    seconds: dict[str, list[float]] = {name: [] for name in names}
    start, low, high = time.perf_counter(), *ROUNDS
    for r in range(high):
        if r >= low and time.perf_counter() - start > PAIR_BUDGET_S:
            break
        for name in names if r % 2 == 0 else reversed(names):
            seconds[name].append(timer(name, lambda name=name: backends[name].run(batch)))
    return {name: 1000.0 * statistics.median(values) for name, values in seconds.items()}


@dataclass
class Measured:
    """What :func:`tournament` found: the winner (open), every candidate's batch-1 ms and what did not open."""

    chosen: str | None
    backend: Any
    ms: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # name -> why it did not open


def tournament(
    names: Sequence[str], opener: Callable[[str], Any], batch: np.ndarray, timer: Timer = _wall
) -> Measured:
    """The fastest of ``names`` by a tournament: the best so far against the next, two open at a time (a model
    held twice, never once per candidate). ``opener(name)``: the open backend, or a str (why it did not open).
    The figures are on one scale: the first pair's ms, then each challenger at its ratio to the best it met
    (pairs timed a while apart on a shared machine are compared through their ratios, never their ms)."""
    result = Measured(None, None)
    for name in names:
        opened = opener(name)
        if isinstance(opened, str):
            result.failed[name] = opened
            continue
        if result.backend is None:
            result.chosen, result.backend = name, opened
            continue
        try:
            pair = time_pair({result.chosen: result.backend, name: opened}, batch, timer)
        except Exception:
            opened.close()
            raise
        # one scale for every figure: the first pair's times, each challenger by its ratio to the best it met
        king = result.ms.setdefault(result.chosen, pair[result.chosen])
        result.ms[name] = king * pair[name] / pair[result.chosen]
        if fastest(result.ms, names) == name:
            result.backend.close()
            result.chosen, result.backend = name, opened
        else:
            opened.close()
    _reopen_fastest(result, names, opener)
    return result


def _reopen_fastest(result: Measured, names: Sequence[str], opener: Callable[[str], Any]) -> None:
    """The rule over every figure may name a backend closed earlier (a faster, less precise one came later and
    moved the fastest time): it is opened again in place of the one held."""
    if not result.ms or fastest(result.ms, names) == result.chosen:
        return
    name = fastest(result.ms, names)
    opened = opener(name)
    if isinstance(opened, str):  # it opened a moment ago: keep what is held, say why
        result.failed[name] = opened
        return
    result.backend.close()
    result.chosen, result.backend = name, opened


# ------------------------------------------------------------------------------------------------
# what is kept: auto-backend.json


def context(artifacts: Any, options: Any, names: Sequence[str]) -> dict[str, Any]:
    """What a measurement holds for: this CPU, this export, these threads, these candidates and libraries."""
    libraries = sorted({lib for name in names for lib in BACKEND_KINDS[name].libraries})
    return {
        "cpu_key": cpu_key(),
        "cpu": cpu_model(),
        "manifest_sha256": artifacts.manifest_sha256,
        "threads": options.threads,
        "device": options.device,
        "candidates": sorted(names),
        "versions": {lib: available(lib)[1] for lib in libraries},
    }


def cache_path(artifacts_dir: str | os.PathLike[str]) -> Path:
    """``auto-backend.json`` beside the export when its folder can be written (or the file is there already),
    else in the user's cache (runtime/local_cache.py)."""
    beside = Path(artifacts_dir) / AUTO_CHOICE_NAME
    if beside.is_file() or writable_dir(Path(artifacts_dir)):
        return beside
    return user_cache_dir(artifacts_dir, "auto") / AUTO_CHOICE_NAME


def read_entries(path: Path) -> dict[str, Any]:
    """Every machine's entry in the file at ``path`` ({} when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    machines = data.get("machines") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return machines if isinstance(machines, dict) else {}


def cached(path: Path, ctx: Mapping[str, Any]) -> dict[str, Any] | None:
    """This machine's entry when it was made in the same ``ctx`` (else None: measure again)."""
    entry = read_entries(path).get(ctx["cpu_key"])
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in ctx.items()):
        return None
    ms, failed = entry.get("ms"), entry.get("failed")
    if not isinstance(ms, dict) or not isinstance(failed, dict) or set(ms) | set(failed) != set(ctx["candidates"]):
        return None
    return entry


def save(
    path: Path,
    ctx: Mapping[str, Any],
    ms: Mapping[str, float],
    chosen: str,
    source: str,
    failed: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """This machine's entry written into the file at ``path`` (other machines' kept); the entry. ``failed``:
    the candidates that did not open (measured again only when something changes)."""
    entry = {
        **ctx,
        "chosen": chosen,
        "ms": {k: round(float(v), 3) for k, v in ms.items()},
        "failed": dict(failed or {}),
        "batch_size": 1,
        "source": source,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    machines = {**read_entries(path), ctx["cpu_key"]: entry}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"format": FORMAT, "version": 1, "machines": machines})
    except OSError as exc:  # a read-only place: measured again next time, said once here
        log.warning("auto: could not keep the measurement in %s: %s", path, exc)
    return entry


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def from_bench(artifacts_dir: str | os.PathLike[str], ctx: Mapping[str, Any], newer_than: str = "") -> dict | None:
    """Batch-1 p50 of every candidate from `vitdeploy bench`'s report beside the export, when it was taken on
    this CPU with these threads (none asked: one per usable core) and after ``newer_than``; else None."""
    try:
        data = json.loads((Path(artifacts_dir) / BENCH_REPORT_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    env, settings = data.get("environment") or {}, data.get("settings") or {}
    if env.get("cpu_key") != ctx["cpu_key"] or settings.get("threads") != (ctx["threads"] or _usable_cores()):
        return None
    if str(data.get("created") or "") <= newer_than:
        return None
    ms = {
        r.get("backend"): float(r["p50_ms"])
        for r in data.get("results") or []
        if r.get("batch_size") == 1 and r.get("backend") in ctx["candidates"] and r.get("p50_ms")
    }
    return ms if set(ms) == set(ctx["candidates"]) else None


@contextlib.contextmanager
def measuring(path: Path) -> Iterator[None]:
    """One process measures at a time for this export on this machine (an advisory lock beside the file):
    replicas started together wait for the first one's figures instead of timing each other."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_name(path.name + ".lock"), "a+")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def choose_on_cpu(artifacts: Any, options: Any, notes: list[str], timer: Timer = _wall) -> tuple[Any, str, str] | None:
    """The CPU candidate auto runs here, open: (backend, name, why it); None when none opens. ``notes`` gets
    one line for each candidate passed over (the module docstring says how the fastest is found)."""
    from .backends import backend_unavailable_reason, open_or_reason

    names = []
    for name in cpu_candidates():
        reason = backend_unavailable_reason(name, artifacts, options) or gate_refusal(name, artifacts)
        if reason:
            notes.append(f"{name} unavailable ({reason})")
        else:
            names.append(name)

    def opener(name: str) -> Any:
        attempt = open_or_reason(name, artifacts, options)
        return attempt.backend if attempt.ok else attempt.reason

    if len(names) <= 1:
        opened = opener(names[0]) if names else "no candidate"
        if isinstance(opened, str):
            notes += [f"{n} failed ({opened})" for n in names]
            return None
        return opened, names[0], "the only candidate here"
    ctx, path = context(artifacts, options, names), cache_path(artifacts.directory)
    entry = _kept(artifacts.directory, path, ctx, names)
    if entry is not None:
        return _open_fastest(entry, names, opener, notes, path)
    with measuring(user_cache_dir(artifacts.directory, "auto") / AUTO_CHOICE_NAME):
        entry = _kept(artifacts.directory, path, ctx, names)  # another process may have measured meanwhile
        if entry is None:  # measure now (opening is part of it), and keep the figures
            got = tournament(names, opener, _probe(artifacts), timer)
            notes += [f"{name} failed ({why})" for name, why in got.failed.items()]
            if got.backend is None:
                return None
            entry = save(path, ctx, got.ms, got.chosen, "measured", got.failed)
            return got.backend, got.chosen, _why(entry, got.chosen, path)
    return _open_fastest(entry, names, opener, notes, path)


def _kept(directory: Path, path: Path, ctx: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any] | None:
    """The figures kept for ``ctx``, or a newer bench's taken on this CPU (then kept too); None: measure."""
    entry = cached(path, ctx)
    bench = from_bench(directory, ctx, str(entry.get("created", "")) if entry else "")
    if bench is not None:
        entry = save(path, ctx, bench, fastest(bench, names), "bench")
    return entry


def _open_fastest(
    entry: Mapping[str, Any], names: Sequence[str], opener: Callable[[str], Any], notes: list[str], path: Path
) -> tuple[Any, str, str] | None:
    """The entry's choice, else (when it fails to open: noted) the fastest of its other figures that opens."""
    # only this run's candidates (each gated here): a kept file names nothing else into the choice
    ms = {n: v for n, v in entry["ms"].items() if n in names} or {n: 0.0 for n in names if n not in entry["failed"]}
    while ms:
        name = entry["chosen"] if entry["chosen"] in ms else fastest(ms, names)
        opened = opener(name)
        if not isinstance(opened, str):
            return opened, name, _why(entry, name, path)
        notes.append(f"{name} failed ({opened})")
        del ms[name]
    return None


def _why(entry: Mapping[str, Any], chosen: str, path: Path) -> str:
    if not entry.get("ms"):
        return "the only one that opened here"
    return f"the fastest here: {describe_figures(entry)}; kept in {path}"


def _probe(artifacts: Any) -> np.ndarray:
    """What a measurement runs: one image of the export's shape (speed does not depend on the pixels)."""
    return np.random.default_rng(0).standard_normal((1, *artifacts.input_shape)).astype(np.float32)


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def describe_figures(entry: Mapping[str, Any]) -> str:
    """ "openvino-int8 33.1 ms, ort-int8 35.0 ms, ort 90.2 ms (batch 1, measured here)": fastest first."""
    ms = entry.get("ms") or {}
    listed = ", ".join(f"{name} {_ms(value)} ms" for name, value in sorted(ms.items(), key=lambda kv: kv[1]))
    source = {"measured": "measured here", "bench": "from vitdeploy bench here"}.get(entry.get("source"), "")
    return f"{listed} (batch 1{', ' + source if source else ''})"


__all__ = [
    "AUTO_CHOICE_NAME",
    "choose_on_cpu",
    "Measured",
    "PRECISION_RANK",
    "TIE",
    "cache_path",
    "cached",
    "context",
    "cpu_candidates",
    "describe_figures",
    "fastest",
    "from_bench",
    "gate_refusal",
    "tournament",
    "measuring",
    "read_entries",
    "save",
    "time_pair",
]
