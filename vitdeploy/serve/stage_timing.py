"""Where a request's time goes in the replica: the W3C ``Server-Timing`` header (HTTP), the same text as
gRPC trailing metadata, and per-stage histograms through Ray Serve's own metrics API.

The stages a request passes, one after the other, measured where the time is spent:

* ``read``: authorisation, the body read from the proxy and inflated (gzip / deflate), a multipart form or a
  gRPC message turned into the v2 form, the request parsed;
* ``decode``: the images decoded and preprocessed (the replica's decode threads);
* ``queue``: waiting for a batch (``@serve.batch``) to fill and to be taken by a model-call thread, and
  the answer's way back to the request;
* ``model``: the model call of the batch (``desc="batch=N"``: how many images shared it);
* ``post``: the answer built (top-k, labels, the v2 tensors, JSON);
* ``total``: the request's time in the replica, from its handler's first line to its answer.

The stages are laps of one clock, so they add up to ``total`` but for the few microseconds after the last
lap (the header itself): a client sees how much of its latency the replica accounts for, and where.

    Server-Timing: read;dur=0.214, decode;dur=2.731, queue;dur=4.902, model;dur=11.507;desc="batch=4",
                   post;dur=0.188, total;dur=19.561

:func:`parse_server_timing` reads the header back (``vitdeploy loadtest`` prints each level's split).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Dict, NamedTuple, Optional

from ..base.vocab import SERVER_STAGES as STAGES  # the stages in the order a request passes them
from ..base.vocab import SERVER_TOTAL as TOTAL  # the replica's time for the request

HEADER = "Server-Timing"
#: The gRPC trailing metadata key (lower case, as gRPC metadata keys are) that carries the same text.
GRPC_KEY = "server-timing"
#: Ray Serve metric names (Ray's exporter prefixes them ``ray_``: ``ray_vitdeploy_stage_ms_bucket``...).
STAGE_METRIC = "vitdeploy_stage_ms"
BATCH_METRIC = "vitdeploy_model_batch_size"
_MS_BOUNDARIES = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000]
_BATCH_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class ModelCall(NamedTuple):
    """One batched model call as each request of the batch sees it: its ns and the images it ran."""

    ns: int
    batch: int


class StageClock:
    """The laps of one request: ``lap(stage)`` gives the time since the last lap to ``stage``."""

    __slots__ = ("start", "last", "ns", "batch")

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter_ns()
        self.ns: Dict[str, int] = dict.fromkeys(STAGES, 0)
        self.batch = 0

    def lap(self, stage: str) -> None:
        now = time.perf_counter_ns()
        self.ns[stage] += now - self.last
        self.last = now

    def batched(self, times: Dict[str, int]) -> None:
        """The lap of decode + queue + model, split as the replica's ``_classify`` measured it (``times``:
        compute_input, compute_infer, batch): what is neither decode nor model call was waiting (``queue``)."""
        now = time.perf_counter_ns()
        span = now - self.last
        decode, model = times.get("compute_input", 0), times.get("compute_infer", 0)
        self.ns["decode"] += decode
        self.ns["model"] += model
        self.ns["queue"] += max(0, span - decode - model)
        self.batch = max(self.batch, int(times.get("batch", 0)))
        self.last = now

    def total_ns(self) -> int:
        return time.perf_counter_ns() - self.start

    def header(self, total_ns: Optional[int] = None) -> str:
        """The ``Server-Timing`` value, durations in milliseconds."""
        parts = []
        for stage in STAGES:
            item = f"{stage};dur={self.ns[stage] / 1e6:.3f}"
            if stage == "model" and self.batch:
                item += f';desc="batch={self.batch}"'
            parts.append(item)
        parts.append(f"{TOTAL};dur={(self.total_ns() if total_ns is None else total_ns) / 1e6:.3f}")
        return ", ".join(parts)


_ITEM = re.compile(r'^\s*([A-Za-z0-9_.-]+)((?:\s*;\s*[A-Za-z]+\s*=\s*(?:"[^"]*"|[^;,]*))*)\s*$')
_PARAM = re.compile(r';\s*([A-Za-z]+)\s*=\s*("[^"]*"|[^;,]*)')


def parse_server_timing(value: Optional[str]) -> Dict[str, float]:
    """A ``Server-Timing`` value -> {stage: ms} (and ``batch`` from the model's ``desc="batch=N"``); the
    metrics it cannot read are left out, an absent header is {}."""
    out: Dict[str, float] = {}
    for item in (value or "").split(","):
        m = _ITEM.match(item)
        if not m:
            continue
        params = {k.lower(): v.strip().strip('"') for k, v in _PARAM.findall(m.group(2))}
        try:
            if "dur" in params:
                out[m.group(1)] = float(params["dur"])
            if params.get("desc", "").startswith("batch="):
                out["batch"] = float(params["desc"].split("=", 1)[1])
        except ValueError:
            continue
    return out


class StageMetrics:
    """The replica's histograms (Ray Serve's metrics API, exported on Ray's Prometheus endpoint with the
    ``ray_serve_*`` metrics): ``vitdeploy_stage_ms`` per ``stage`` and ``vitdeploy_model_batch_size`` per
    model call, labelled model, version and backend (Ray adds application, deployment and replica)."""

    def __init__(self, model: str, version: str, backend: str) -> None:
        from ray.serve.metrics import Histogram

        tags = {"model": model, "version": str(version), "backend": backend}
        self.stages = Histogram(
            STAGE_METRIC,
            description="ms a request spent in each stage in the replica (read, decode, queue, model, post, total)",
            boundaries=_MS_BOUNDARIES,
            tag_keys=("model", "version", "backend", "stage"),
        )
        self.stages.set_default_tags(dict(tags))  # Ray adds its own tags to the dict it is given
        self.batches = Histogram(
            BATCH_METRIC,
            description="images per model call (the batch @serve.batch gathered)",
            boundaries=_BATCH_BOUNDARIES,
            tag_keys=("model", "version", "backend"),
        )
        self.batches.set_default_tags(dict(tags))

    def observe(self, clock: StageClock, total_ns: int) -> None:
        for stage in STAGES:
            self.stages.observe(clock.ns[stage] / 1e6, tags={"stage": stage})
        self.stages.observe(total_ns / 1e6, tags={"stage": TOTAL})

    def model_call(self, batch: int) -> None:
        self.batches.observe(batch)


def finish(
    clock: Optional[StageClock], metrics: Optional[StageMetrics], spans: Optional[Callable[..., None]] = None
) -> Optional[str]:
    """The request's last lap (``post``) taken: its histograms observed, its stage spans made (``spans``:
    serve/tracing.py's ``StageSpans`` when traces are exported), its ``Server-Timing`` value returned; None when
    stage timing is off (``serve.stage_timing: false``: ``clock`` is None)."""
    if clock is None:
        return None
    clock.lap("post")
    total = clock.total_ns()
    if metrics is not None:
        metrics.observe(clock, total)
    if spans is not None:
        spans(clock, total)
    return clock.header(total)


def start(enabled: bool) -> Optional[StageClock]:
    """A request's clock, or None when stage timing is off."""
    return StageClock() if enabled else None


def lap(clock: Optional[StageClock], stage: str) -> None:
    if clock is not None:
        clock.lap(stage)


def batched(clock: Optional[StageClock], times: Dict[str, int]) -> None:
    if clock is not None:
        clock.batched(times)


def open_metrics(enabled: bool, model: str, version: Any, backend: str) -> Optional[StageMetrics]:
    """The replica's histograms, or None when stage timing is off."""
    return StageMetrics(model, str(version), backend) if enabled else None


__all__ = [
    "BATCH_METRIC",
    "GRPC_KEY",
    "HEADER",
    "ModelCall",
    "STAGES",
    "STAGE_METRIC",
    "StageClock",
    "StageMetrics",
    "TOTAL",
    "finish",
    "parse_server_timing",
]
