"""The one error mapping (vitdeploy/cli/errors.py): every command the `vitdeploy` group holds, whichever module
defines it, turns an error into one ``error:`` line and its exit code; a command registered later gets it too."""

from __future__ import annotations

import errno

import click
import pytest
from click.testing import CliRunner

from vitdeploy.base.errors import (
    BackendError,
    ConfigError,
    StageUnavailableError,
    ValidationError,
    VitDeployError,
    WriteError,
)
from vitdeploy.cli import main

MESSAGE = "what failed, which file, how to fix it\nthe rest of the message: never on the console"


def registered(group: click.Group, path: tuple[str, ...] = ()):
    """(argv path, command) of every command under ``group``, its sub-groups' commands included."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from registered(command, (*path, name))
        else:
            yield (*path, name), command


def required_args(command: click.Command) -> list[str]:
    """A value for each required parameter: enough for click to reach the command's callback."""
    args: list[str] = []
    for param in command.params:
        if param.required:
            args += ["x"] if isinstance(param, click.Argument) else [param.opts[0], "x"]
    return args


COMMANDS = list(registered(main))


def run(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_the_walk_sees_every_command():
    names = {" ".join(path) for path, _ in COMMANDS}
    expected = {"export", "predict", "batch-predict", "validate", "bench", "info", "config check"}
    expected |= {"config reference", "report", "serve", "triton-repo", "loadtest", "tune", "rollout", "sign"}
    assert names == expected


@pytest.mark.parametrize("error", [ConfigError, ValidationError, StageUnavailableError, BackendError, VitDeployError])
@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(path) for path, _ in COMMANDS])
def test_every_command_maps_an_error_to_one_line_and_its_exit_code(path, command, error, monkeypatch):
    def fail(**_: object) -> None:
        raise error(MESSAGE)

    monkeypatch.setattr(command, "callback", fail)
    res = run([*path, *required_args(command)])
    assert (res.exit_code, res.stdout, res.stderr) == (error.exit_code, "", f"error: {MESSAGE.splitlines()[0]}\n")


def test_a_command_registered_later_is_mapped_too(monkeypatch):
    @click.command("late")
    def late() -> None:
        raise ConfigError("late: refused")

    monkeypatch.setitem(main.commands, "late", late)
    res = run(["late"])
    assert (res.exit_code, res.output) == (2, "error: late: refused\n")


@pytest.mark.parametrize(
    "raised, code, line",
    [
        (KeyboardInterrupt(), 130, "error: interrupted; no partial artifact was left under a final name\n"),
        (
            OSError(errno.ENOSPC, "No space left on device"),
            WriteError.exit_code,
            "error: cannot write a file: No space",
        ),
    ],
)
def test_ctrl_c_and_a_failed_write_are_one_line_too(monkeypatch, raised, code, line):
    def fail(**_: object) -> None:
        raise raised

    monkeypatch.setattr(main.commands["bench"], "callback", fail)
    res = run(["bench"])
    assert res.exit_code == code and res.stdout == "" and res.stderr.startswith(line), res.output
    assert res.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "raised, debug", [(OSError(errno.ENOENT, "a bug, not the machine's fault"), ""), (ConfigError("shown whole"), "1")]
)
def test_other_faults_and_debug_mode_keep_the_traceback(monkeypatch, raised, debug):
    def fail(**_: object) -> None:
        raise raised

    monkeypatch.setattr(main.commands["bench"], "callback", fail)
    monkeypatch.setenv("VITDEPLOY_DEBUG", debug)
    with pytest.raises(type(raised)) as seen:
        run(["bench"])
    assert seen.value is raised
