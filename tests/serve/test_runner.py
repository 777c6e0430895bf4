"""serve's own Ray: a start that Ray itself timed out (a busy machine) is tried once more, nothing else is."""

from __future__ import annotations

import pytest

from vitdeploy.serve.runner import RAY_START_TIMEOUT, init_ray_retrying


class _Ray:
    """ray.init failing with the given errors in turn, then answering; counts shutdowns."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.inits, self.shutdowns = list(errors), [], 0

    def init(self, **options):
        self.inits.append(options)
        if self.errors:
            raise self.errors.pop(0)
        return "ctx"

    def shutdown(self):
        self.shutdowns += 1


def test_a_start_ray_timed_out_is_tried_once_more_after_a_shutdown_and_said():
    ray, lines = _Ray(Exception(f"The current node {RAY_START_TIMEOUT}. This could happen ...")), []
    assert init_ray_retrying(ray, lines.append, address="local", num_cpus=2) == "ctx"
    assert ray.inits == [{"address": "local", "num_cpus": 2}] * 2 and ray.shutdowns == 1
    assert len(lines) == 1 and "starting it once more" in lines[0]


def test_a_second_timeout_or_any_other_failure_is_raised():
    twice = _Ray(Exception(f"node {RAY_START_TIMEOUT}"), Exception(f"node {RAY_START_TIMEOUT}"))
    with pytest.raises(Exception, match=RAY_START_TIMEOUT):
        init_ray_retrying(twice, lambda line: None, address="local")
    assert len(twice.inits) == 2
    other = _Ray(ValueError("port 8265 in use"))
    with pytest.raises(ValueError, match="port 8265"):
        init_ray_retrying(other, lambda line: None, address="local")
    assert len(other.inits) == 1 and other.shutdowns == 0
