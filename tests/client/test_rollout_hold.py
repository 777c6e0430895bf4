"""The crash tests' hook (vitdeploy/client/rollout/hold.py) cannot be reached by accident: unset, it does nothing;
set to anything but ``PHASE:MARKER`` it refuses to run; set, it says so first and holds at its phase only. And
`rollout --lease` refuses a lease too short to be renewed. No Ray here: tests/client/test_rollout_crash.py holds
real rollouts and kills them."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from vitdeploy.base.errors import ConfigError
from vitdeploy.client.rollout.hold import HOLD_ENV, HOLD_POINTS, Hold, hold_from_env, hold_point


def test_unset_the_hook_does_nothing_at_any_phase(tmp_path):
    lines: list[str] = []
    at = hold_point({}, lines.append)
    for phase in HOLD_POINTS:
        at(phase, version=2, live=1)  # returns at once: nothing held, nothing written
    assert lines == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "value",
    ["draining", "draning:{dir}/m.json", "draining:m.json", "draining:{dir}/nowhere/m.json", "draining:{dir}/here"],
    ids=["no-marker", "typo", "relative", "no-folder", "marker-exists"],
)
def test_a_value_that_is_not_a_phase_and_a_new_marker_path_is_refused(tmp_path, value):
    (tmp_path / "here").write_text("")
    with pytest.raises(ConfigError, match=rf"^{HOLD_ENV}=.*a test-only hook, PHASE:MARKER with PHASE one of"):
        hold_from_env({HOLD_ENV: value.format(dir=tmp_path)})


def test_set_it_says_so_first_and_holds_only_at_its_phase(tmp_path):
    marker = tmp_path / "held.json"
    lines: list[str] = []
    at = hold_point({HOLD_ENV: f"shadow:{marker}"}, lines.append)
    assert lines == [f"TEST HOOK {HOLD_ENV} is set: this rollout holds at shadow (writes {marker}); unset it outside "
                     "vitdeploy's tests"]  # fmt: skip
    at("starting", version=2, live=1)
    assert not marker.exists()
    Hold("shadow", marker).reached("shadow", max_s=0.0, version=2, live=1)  # held for no time: what it writes
    assert json.loads(marker.read_text()) == {"phase": "shadow", "pid": os.getpid(), "version": 2, "live": 1}


@pytest.mark.parametrize("lease", ["500ms", "0s", "soon"])
def test_a_lease_shorter_than_a_second_is_refused_before_anything_runs(lease):
    from vitdeploy.cli import main

    result = CliRunner().invoke(main, ["rollout", "http://127.0.0.1:9", "-a", "x", "--lease", lease])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: --lease ") and lease in line and "Traceback" not in result.output
