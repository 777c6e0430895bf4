"""What commands share (vitdeploy/cli/options.py): a command's two modes, declared once, refused in one line
(exit 2) before the command runs: `validate` here or against a server (--url), `triton-repo` writing or adding
a version (--new-version)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main

URL_ONLY = "error: --protocol, --model, --backend and --cacert judge a running server: they go with --url URL\n"
LOCAL_ONLY = "error: --backends names in-process backends; with --url, --backend names the thresholds\n"
ONE_OF = "error: --force replaces OUT, --new-version adds to it: pass one of them\n"


@pytest.fixture()
def reached(monkeypatch):
    """The commands' callbacks replaced by a recorder: a call means the modes let the options through."""
    calls: list[dict] = []
    for name in ("validate", "triton-repo"):
        monkeypatch.setattr(main.commands[name], "callback", lambda **kw: calls.append(kw))
    return calls


@pytest.mark.parametrize(
    "args, refusal",
    [
        (["validate", "--url", "http://h:8000", "--backends", "ort"], LOCAL_ONLY),
        (["validate", "--url", "http://h:8000", "-b", "ort", "--model", "m"], LOCAL_ONLY),
        (["validate", "--model", "m"], URL_ONLY),
        (["validate", "--protocol", "v2-http"], URL_ONLY),
        (["validate", "--backend", "ort", "-b", "ort"], URL_ONLY),
        (["validate", "--cacert", "ca.pem"], URL_ONLY),
        (["triton-repo", "-o", "repo", "--force", "--new-version"], ONE_OF),
        (["triton-repo", "-o", "repo", "--new-version", "--force"], ONE_OF),
    ],
)
def test_an_option_of_the_other_mode_is_one_line_and_exit_2(reached, args, refusal):
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert (res.exit_code, res.stdout, res.stderr) == (2, "", refusal)
    assert not reached


@pytest.mark.parametrize(
    "args",
    [
        ["validate"],
        ["validate", "-b", "ort", "--image-size", "32"],
        ["validate", "--url", "http://h:8000", "--protocol", "v2-http", "--model", "m", "--backend", "ort"],
        ["triton-repo", "-o", "repo", "--force"],
        ["triton-repo", "-o", "repo", "--new-version"],
    ],
)
def test_each_mode_with_its_own_options_runs(reached, args):
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0 and len(reached) == 1, res.output
