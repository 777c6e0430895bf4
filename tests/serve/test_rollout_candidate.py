"""What CPU a rollout's candidate takes beside the live replicas (vitdeploy/serve/rollout/candidate.py): never more
than is free, so Ray never waits for resources that will not come; a model applied from a Serve config refused
with the way to roll it out declaratively. Starting and removing a real one: tests/client/test_rollout_driver.py."""

from __future__ import annotations

from vitdeploy.serve.rollout.candidate import candidate_cpus


def test_a_candidate_gets_what_it_asks_when_that_much_is_free():
    assert candidate_cpus(1.0, 1.0) == (1.0, None)
    assert candidate_cpus(0.5, 3.0) == (0.5, None)


def test_on_a_full_machine_it_takes_what_is_free_and_says_so():
    cpus, note = candidate_cpus(2.0, 1.37)
    assert cpus == 1.3 and "1.3 CPU is what is free" in note and "2 asked" in note


def test_a_candidate_without_one_real_cpu_cannot_be_placed():
    """No CPU of its own (less than one, or than it asked when it asked less): refused, never started to share."""
    import pytest

    from vitdeploy.base.errors import BackendError

    for asked, free in ((1.0, 0.0), (2.0, 0.9), (0.5, 0.4)):
        with pytest.raises(BackendError, match=r"cannot be placed: .* CPU is free .* needs at least"):
            candidate_cpus(asked, free)
    assert candidate_cpus(2.0, 1.0) == (1.0, "1 CPU is what is free beside the live replicas (2 asked)")


def test_a_model_applied_from_a_serve_config_is_refused_in_one_line_saying_how_to_roll_it_out():
    """`serve deploy` or a RayService would put the old export back: the rollout is the config's to make."""
    from vitdeploy.serve.rollout.candidate import declarative_refusal

    line = declarative_refusal("vit", {"vit": "declarative", "other": "imperative"})
    assert line is not None and "\n" not in line
    assert "'vit'" in line and "args.artifacts" in line and "--write-config" in line and "serve deploy" in line
    assert "RayService" in line
    assert "'vit@v2'" in declarative_refusal("vit", {"vit": "imperative", "vit@v2": "declarative"})


def test_a_model_started_by_vitdeploy_serve_or_another_models_config_is_not_refused():
    from vitdeploy.serve.rollout.candidate import declarative_refusal

    assert declarative_refusal("vit", {"vit": "imperative", "vit@v2": "imperative"}) is None
    assert declarative_refusal("vit", {"vit": "imperative", "vitals": "declarative", "other": "declarative"}) is None
    assert declarative_refusal("vit", {}) is None  # a Ray that does not say: as before


def test_the_cpu_a_version_just_removed_frees_is_waited_for_a_moment(monkeypatch):
    """Ray's view of free CPU lags a removal (what an abandoned rollout left, removed just before the candidate
    starts): the CPU one needs is read again until it shows, within a bound; never waited for without end."""
    import ray

    from vitdeploy.serve.rollout import candidate

    reads = iter([0.0, 0.0, 1.0])
    monkeypatch.setattr(candidate.time, "sleep", lambda s: None)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": next(reads)})
    assert candidate.free_cpus(1.0) == 1.0  # the third read
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 0.0})
    assert candidate.free_cpus(1.0, wait_s=0.0) == 0.0  # none comes: the last read, at once
    assert candidate.free_cpus() == 0.0  # nothing asked: one read
