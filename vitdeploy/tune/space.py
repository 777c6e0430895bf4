"""What `vitdeploy tune` may change on a server, and what each change costs.

A serve candidate is the replica layout (replicas x Ray CPUs per replica, within the machine's cores), the
model calls a replica runs at once, its decode threads, and the batch settings. ONNX Runtime's threads follow
the layout as `vitdeploy serve` sets them (ray_app ``ReplicaSpec.threads``: a replica's cores split among its
concurrent calls), so one key says both. The batch settings change on the running replicas
(``reconfigure``), the replica count scales in place, the rest replaces the replicas.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator

#: every knob, in the order the search visits them (the layout first: it decides the most)
SERVE_KNOBS = ("backend", "layout", "concurrent_batches", "max_batch_size", "batch_wait_timeout_s", "decode_threads")
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
WAITS_S = (0.0, 0.002, 0.005, 0.01, 0.02)
CONCURRENT_BATCHES = (1, 2)
DECODE_THREADS = (1, 2, 4)
#: the replicas' ongoing-request limit while tuning: above every candidate's max_batch_size x concurrent_batches
TUNING_MAX_ONGOING = max(BATCH_SIZES) * max(CONCURRENT_BATCHES) * 2


@dataclass(frozen=True, order=True)
class ServeCandidate:
    backend: str
    replicas: int
    cpus_per_replica: int
    concurrent_batches: int
    max_batch_size: int
    batch_wait_timeout_s: float
    decode_threads: int

    @property
    def restart_key(self) -> tuple:
        """What replaces the replicas when it changes (the rest changes in place)."""
        return (self.backend, self.cpus_per_replica, self.concurrent_batches, self.decode_threads)

    @property
    def user_config(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "batch_wait_timeout_s": self.batch_wait_timeout_s}

    def serve_keys(self) -> dict[str, Any]:
        """The ``serve:`` keys of this candidate, as pipeline.yaml spells them."""
        return {
            "replicas": self.replicas,
            "num_cpus_per_replica": self.cpus_per_replica,
            "concurrent_batches": self.concurrent_batches,
            "max_batch_size": self.max_batch_size,
            "batch_wait_timeout_s": self.batch_wait_timeout_s,
            "decode_threads": self.decode_threads,
            "max_ongoing_requests": max(64, self.max_batch_size * self.concurrent_batches),
        }

    def overlay_keys(self) -> list[tuple[str, str, Any, str]]:
        """(section, key, value, knob) of every key the overlay writes; knob: the search's, or "" for none."""
        knob = {"replicas": "layout", "num_cpus_per_replica": "layout", "max_ongoing_requests": ""}
        return [("runtime", "backend", self.backend, "backend")] + [
            ("serve", key, value, knob.get(key, key)) for key, value in self.serve_keys().items()
        ]

    def describe(self) -> str:
        return (
            f"{self.backend}, {self.replicas}x{self.cpus_per_replica} cpu, {self.concurrent_batches} call(s), batch "
            f"{self.max_batch_size}/{self.batch_wait_timeout_s * 1000:g} ms, {self.decode_threads} decode"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_candidate(sv: Any, cores: int, backend: str) -> ServeCandidate:
    """The ``serve:`` section's own settings (the defaults, unless the user's config changed them)."""
    cpus = max(1, min(cores, int(round(sv.num_cpus_per_replica or 1))))
    return ServeCandidate(
        backend=backend,
        replicas=max(1, int(sv.replicas)),
        cpus_per_replica=cpus,
        concurrent_batches=int(sv.concurrent_batches),
        max_batch_size=int(sv.max_batch_size),
        batch_wait_timeout_s=float(sv.batch_wait_timeout_s),
        decode_threads=int(sv.decode_threads),
    )


def layouts(cores: int) -> list[tuple[int, int]]:
    """(replicas, CPUs per replica) that use the whole machine: 1 x cores, 2 x cores/2, ... cores x 1."""
    return [(r, cores // r) for r in range(1, cores + 1) if cores % r == 0 and (r & (r - 1)) == 0 or r == cores]


def neighbours(
    base: ServeCandidate, knob: str, cores: int, max_batch: int, backends: tuple[str, ...] = ()
) -> Iterator[ServeCandidate]:
    """``base`` with ``knob`` set to each of its values (``base`` itself included); ``backends``: those that
    passed validation and run here."""
    if knob == "backend":
        for b in backends or (base.backend,):
            yield replace(base, backend=b)
    elif knob == "layout":
        for r, c in layouts(cores):
            yield replace(base, replicas=r, cpus_per_replica=c)
    elif knob == "concurrent_batches":
        for n in CONCURRENT_BATCHES:
            yield replace(base, concurrent_batches=n)
    elif knob == "max_batch_size":
        for b in BATCH_SIZES:
            if b <= max_batch:
                yield replace(base, max_batch_size=b)
    elif knob == "batch_wait_timeout_s":
        for w in WAITS_S:
            yield replace(base, batch_wait_timeout_s=w)
    elif knob == "decode_threads":
        for d in DECODE_THREADS:
            if d <= max(2, 2 * base.cpus_per_replica):
                yield replace(base, decode_threads=d)
    else:
        raise ValueError(f"unknown knob {knob!r}")


def grid(cores: int, max_batch: int, backend: str, waits: tuple[float, ...] = WAITS_S) -> list[ServeCandidate]:
    """Every candidate of the layout, concurrent calls, batch size and wait (decode threads at 1 per CPU) of one
    backend: the reference a search is judged against (benchmarks/bench_tune.py)."""
    return [
        ServeCandidate(backend, r, c, n, b, w, max(1, c))
        for r, c in layouts(cores)
        for n in CONCURRENT_BATCHES
        for b in BATCH_SIZES
        if b <= max_batch
        for w in (waits if b > 1 else (0.0,))
    ]


TRITON_KNOBS = ("instances", "preprocess_instances", "max_queue_delay_us")
QUEUE_DELAYS_US = (0, 1000, 2000, 5000, 10000)


@dataclass(frozen=True, order=True)
class TritonCandidate:
    """The generated Triton repository's settings: instances of the inference model (ONNX Runtime's threads
    follow: the cores shared among them), of the preprocessing model, and the dynamic batcher's wait."""

    instances: int
    preprocess_instances: int
    max_queue_delay_us: int
    cores: int = 1

    @property
    def restart_key(self) -> tuple:
        return ()  # every change is a model reload on the running server

    def triton_keys(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "ort_threads": max(1, self.cores // self.instances),
            "preprocess_instances": self.preprocess_instances,
            "max_queue_delay_us": self.max_queue_delay_us,
        }

    def overlay_keys(self) -> list[tuple[str, str, Any, str]]:
        keys = [("triton", "inference", "ort_python", "")]  # what was measured (python backend: every server has it)
        return keys + [("triton", k, v, "" if k == "ort_threads" else k) for k, v in self.triton_keys().items()]

    def describe(self) -> str:
        return (
            f"{self.instances} instance(s) x {max(1, self.cores // self.instances)} thread(s), "
            f"{self.preprocess_instances} preprocess, queue delay {self.max_queue_delay_us} us"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_triton_candidate(triton: Any, cores: int) -> TritonCandidate:
    return TritonCandidate(
        int(triton.instances), int(triton.preprocess_instances), int(triton.max_queue_delay_us), cores
    )


def triton_neighbours(base: TritonCandidate, knob: str) -> Iterator[TritonCandidate]:
    if knob == "instances":
        for n in sorted({1, *(r for r, _ in layouts(base.cores))}):
            yield replace(base, instances=n)
    elif knob == "preprocess_instances":
        for n in (1, 2):
            yield replace(base, preprocess_instances=n)
    elif knob == "max_queue_delay_us":
        for d in QUEUE_DELAYS_US:
            yield replace(base, max_queue_delay_us=d)
    else:
        raise ValueError(f"unknown knob {knob!r}")


__all__ = [
    "SERVE_KNOBS",
    "TRITON_KNOBS",
    "TUNING_MAX_ONGOING",
    "ServeCandidate",
    "TritonCandidate",
    "default_candidate",
    "default_triton_candidate",
    "layouts",
    "neighbours",
    "triton_neighbours",
    "grid",
]
