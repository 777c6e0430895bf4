"""Each replica's threads fit the cores Ray gives it (serve.num_cpus_per_replica): the concurrent model
calls (serve.concurrent_batches) share them instead of each taking all of them."""

from __future__ import annotations

import pytest

from vitdeploy.runtime.backends.base import BackendOptions
from vitdeploy.serve.replica_spec import ReplicaSpec


def _spec(
    num_cpus: float, concurrent_batches: int, threads: int | None = None, decode_threads: int = 4
) -> ReplicaSpec:
    return ReplicaSpec(
        artifacts="x",
        backend="ort",
        options=BackendOptions(threads=threads),
        max_pixels=1,
        top_k=1,
        max_batch_size=16,
        batch_wait_timeout_s=0.01,
        decode_threads=decode_threads,
        concurrent_batches=concurrent_batches,
        max_images_per_request=1,
        max_request_bytes=1,
        num_cpus=num_cpus,
    )


@pytest.mark.parametrize(
    "num_cpus, concurrent, expected",
    [
        (2, 2, (1, 2)),  # two calls of one thread each on two cores (not two of two)
        (2, 1, (2, 2)),  # one call takes both cores
        (4, 2, (2, 4)),
        (0.5, 2, (1, 1)),  # a fraction of a core: one thread per call, one decoding thread
        (8, 3, (2, 4)),  # decode threads stay serve.decode_threads (4) when there are more cores
    ],
)
def test_intra_op_threads_times_concurrent_batches_fit_the_replicas_cores(num_cpus, concurrent, expected):
    assert _spec(num_cpus, concurrent).threads() == expected


def test_runtime_threads_set_by_the_user_win():
    assert _spec(2, 2, threads=2).threads() == (2, 2)
