"""batch-predict's settings: pipeline.yaml's batch: section, the command line over it, bad values named."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.batch.job import BatchSettings, _connect, batch_settings_from_config, pool_size


def test_the_command_line_overrides_the_batch_section_which_overrides_the_defaults(tmp_path):
    cfg = parse_config(
        {
            "batch": {"workers": 3, "gpus_per_worker": 0.5, "cache_dir": "cache"},
            "runtime": {"backend": "ort", "top_k": 2},
        },
        tmp_path / "pipeline.yaml",
    )
    s = batch_settings_from_config(cfg, ["a/"], artifacts=None, output="o.jsonl", workers=None, top_k=4, resume=True)
    assert (s.workers, s.gpus_per_worker, s.backend, s.top_k, s.resume) == (3, 0.5, "ort", 4, True)
    assert s.cache_dir == tmp_path / "cache" and s.artifacts == str(tmp_path / "artifacts")
    assert s.batch_size is None and s.decode_cpus == 1.0  # None: the export's opt, read from the manifest
    assert s.embedding_dtype == "float32"
    half = parse_config({"batch": {"embedding_dtype": "float16"}}, tmp_path / "pipeline.yaml")
    assert batch_settings_from_config(half, ["a/"], artifacts=None, output="o/").embedding_dtype == "float16"
    s = batch_settings_from_config(half, ["a/"], artifacts=None, output="o/", embedding_dtype="float32")
    assert s.embedding_dtype == "float32"  # --embedding-dtype over the config


@pytest.mark.parametrize(
    "key, value",
    [
        ("workers", 0),
        ("workers", "many"),
        ("decode_cpus", 0),
        ("flush_seconds", -1),
        ("batch_size", 0),
        ("threads", 2),
        ("embedding_dtype", "float64"),
    ],
)
def test_a_bad_batch_key_is_one_error_naming_it(key, value):
    with pytest.raises(ConfigError, match=rf"batch\.{key}"):
        parse_config({"batch": {key: value}})


@pytest.mark.parametrize("key, value", [("workers", 0), ("decode_cpus", 0), ("batch_size", 0), ("threads", 2)])
def test_settings_made_in_python_are_checked_as_the_batch_section_is(key, value):
    """BatchSettings is pipeline.yaml's batch section and what the job adds: the same fields, the same checks."""
    with pytest.raises(ValidationError, match=key):
        BatchSettings(inputs=[], artifacts="a", output="o", **{key: value})


def test_workers_default_to_auto_one_per_core_on_a_ray_started_here_else_one():
    assert parse_config({}).batch.workers == "auto"
    auto = BatchSettings(inputs=[], artifacts="a", output="o")  # cpus_per_worker 1, decode_cpus 1
    assert pool_size(auto, local=True, cores=2) == (2, 3.0)  # two 1-thread actors; Ray gets a CPU more for decoding
    assert pool_size(auto.model_copy(update={"cpus_per_worker": 2.0}), local=True, cores=8) == (4, 9.0)
    assert pool_size(auto.model_copy(update={"cpus_per_worker": 0.5}), local=True, cores=4) == (4, 4.0)
    assert pool_size(auto, local=False, cores=64) == (1, None)  # a cluster: its autoscaler, not this machine
    assert pool_size(auto.model_copy(update={"gpus_per_worker": 1.0}), local=True, cores=8) == (1, None)
    assert pool_size(auto.model_copy(update={"workers": 3}), local=True, cores=2) == (3, None)  # as asked


class _FakeRay:
    """What _connect asks of Ray: is it running here, and the arguments of init."""

    def __init__(self, running: bool = False) -> None:
        self.running, self.calls = running, []

    def is_initialized(self) -> bool:
        return self.running

    def init(self, **kwargs):
        self.calls.append(kwargs)
        return SimpleNamespace(address_info={"node_ip_address": "127.0.0.1"})  # a Ray of its own: on loopback


def test_a_job_starts_a_ray_of_its_own_unless_given_a_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    auto = BatchSettings(inputs=[], artifacts="a", output="o")
    ray = _FakeRay()
    owned, resolved = _connect(ray, auto)  # never joins whatever Ray runs on this machine: "local"
    assert owned and ray.calls[0]["address"] == "local" and ray.calls[0]["num_cpus"] >= resolved.workers >= 1
    ray = _FakeRay()
    owned, resolved = _connect(ray, auto.model_copy(update={"address": "ray://head:10001"}))
    assert (ray.calls[0]["address"], ray.calls[0]["num_cpus"], resolved.workers) == ("ray://head:10001", None, 1)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a job run by `ray job submit` on a cluster
    ray = _FakeRay()
    owned, resolved = _connect(ray, auto)
    assert (ray.calls[0]["address"], ray.calls[0]["num_cpus"], resolved.workers) == ("10.0.0.1:6379", None, 1)
    assert resolved.address == "10.0.0.1:6379"  # what the job says it ran on
    ray = _FakeRay(running=True)  # this process already runs Ray: used as it is
    owned, resolved = _connect(ray, auto)
    assert not owned and not ray.calls and resolved.workers == 1


def test_each_actor_runs_the_threads_of_the_cpus_ray_gives_it_not_a_predictors_runtime_threads():
    from vitdeploy.batch.job import actor_options
    from vitdeploy.runtime.backends.base import BackendOptions

    one = BatchSettings(inputs=[], artifacts="a", output="o")  # cpus_per_worker 1: two actors on 2 cores
    # runtime.threads 2 (set for predict) would run 4 threads on 2 cores
    assert actor_options(BackendOptions(threads=2), one).threads == 1
    assert actor_options(BackendOptions(), one).threads == 1
    assert actor_options(BackendOptions(threads=1), one.model_copy(update={"cpus_per_worker": 4.0})).threads == 4
    half = one.model_copy(update={"cpus_per_worker": 0.5})  # a fraction: runtime.threads, else the library's
    assert actor_options(BackendOptions(threads=3), half).threads == 3
    assert actor_options(BackendOptions(), half).threads is None
