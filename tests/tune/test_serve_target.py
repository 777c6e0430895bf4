"""The serve target of `vitdeploy tune`, for real: batch settings and the replica count change on the running
replicas (the same process), a new layout replaces them, and closing stops Ray with every process it started."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("ray.serve", reason="vitdeploy tune --target serve needs ray[serve]")

from helpers.held import processes  # noqa: E402

from vitdeploy.base.config import parse_config  # noqa: E402
from vitdeploy.client.loadtest import LoadPlan, load_images, run_loadtest  # noqa: E402
from vitdeploy.client.protocols import PREDICT, Target  # noqa: E402
from vitdeploy.runtime.backends import BackendOptions  # noqa: E402
from vitdeploy.tune.serve_target import IN_PLACE, REPLACED, STARTED, ServeTarget  # noqa: E402
from vitdeploy.tune.space import ServeCandidate  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _replicas() -> list[int]:
    return sorted(processes("ServeReplica:", root=os.getpid()))


def _answers(target: ServeTarget) -> int:
    plan = LoadPlan(
        Target(target.url, PREDICT, target.name), load_images(None), concurrency=(2,), requests=4, warmup_s=0
    )
    return run_loadtest(plan).levels[0].ok


def test_batch_settings_and_replica_count_change_in_place_and_a_new_layout_replaces(demo_artifacts):
    base = ServeCandidate("ort", 1, 1, 2, 16, 0.01, 1)
    with ServeTarget(parse_config({}), demo_artifacts, BackendOptions()) as target:
        assert target.apply(base) == STARTED and _answers(target) == 4
        first = _replicas()
        assert len(first) == 1
        assert target.apply(ServeCandidate("ort", 1, 1, 2, 4, 0.0, 1)) == IN_PLACE  # batch 16 -> 4, wait 10 -> 0 ms
        assert _replicas() == first and _answers(target) == 4  # the same replica process, reconfigured
        assert target.apply(ServeCandidate("ort", 2, 1, 2, 4, 0.0, 1)) == IN_PLACE  # one more replica
        deadline = time.monotonic() + 60
        while len(_replicas()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first[0] in _replicas() and len(_replicas()) == 2
        assert target.apply(ServeCandidate("ort", 2, 1, 1, 4, 0.0, 1)) == REPLACED  # one call at a time: new replicas
        assert first[0] not in _replicas() and _answers(target) == 4
    deadline = time.monotonic() + 30  # Ray's processes exit once shutdown has signalled them
    while (
        processes("ray::", root=os.getpid()) or processes("raylet", root=os.getpid())
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes("ray::", root=os.getpid()) and not processes("raylet", root=os.getpid())
