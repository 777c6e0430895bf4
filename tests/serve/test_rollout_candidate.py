"""What CPU a rollout's candidate takes beside the live replicas (vitdeploy/serve/rollout/candidate.py): never more
than is free, so Ray never waits for resources that will not come; starting and removing a real one:
tests/client/test_rollout_driver.py."""

from __future__ import annotations

from vitdeploy.serve.rollout.candidate import candidate_cpus


def test_a_candidate_gets_what_it_asks_when_that_much_is_free():
    assert candidate_cpus(1.0, 1.0) == (1.0, None)
    assert candidate_cpus(0.5, 3.0) == (0.5, None)


def test_on_a_full_machine_it_takes_what_is_free_and_says_so():
    cpus, note = candidate_cpus(2.0, 1.37)
    assert cpus == 1.3 and "1.3 CPU is what is free" in note and "2 asked" in note
    cpus, note = candidate_cpus(1.0, 0.0)
    assert cpus == 0.0 and "shares their cores" in note
