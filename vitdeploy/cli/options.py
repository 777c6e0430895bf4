"""What several commands share: their options, the backend options a config gives, and commands with two modes.

A command with two modes (``validate`` judges an export here, or a running server with ``--url``;
``triton-repo`` writes a repository, or adds a version to one with ``--new-version``) declares which options
belong to which mode (:class:`Modes`, a :class:`ModalCommand`'s ``modes``): an option given in the other
mode is one ``error:`` line and exit 2 (a ConfigError), before the command runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ..base.errors import ConfigError
from ..base.vocab import AUTO, RUNTIME_BACKENDS

config_option = click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="pipeline YAML (default: ./pipeline.yaml if present, else built-in defaults)",
)

revision_option = click.option(
    "--revision",
    default=None,
    help="Hub revision of MODEL: a branch, tag or commit (same as MODEL@revision; default: the repo's main branch)",
)

model_argument = click.argument("model", required=False, metavar="[MODEL]")

#: -b/--backend of the commands that run the export here or start a server (predict, batch-predict, serve).
backend_option = click.option(
    "-b",
    "--backend",
    type=click.Choice([AUTO, *RUNTIME_BACKENDS]),
    default=None,
    help="backend (default: runtime.backend from the config, i.e. auto)",
)

#: -a/--artifacts of the commands that read an export folder from the local disk (validate, bench).
artifacts_option = click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    type=click.Path(path_type=Path, readable=False),
    default=Path("artifacts"),
    show_default=True,
    help="directory written by `vitdeploy export`",
)

#: -a/--artifacts of the commands whose export folder defaults to export.output_dir from the config
export_folder_option = click.option(
    "-a",
    "--artifacts",
    "artifacts_dir",
    type=click.Path(path_type=Path, readable=False),
    default=None,
    help="directory written by `vitdeploy export` (default: export.output_dir from the config)",
)


def runtime_options(cfg: Any) -> Any:
    """The backends' options (threads, providers, ...) the config's ``runtime:`` section gives."""
    from ..runtime.backends.base import BackendOptions

    return BackendOptions.from_runtime(cfg.runtime)


#: loadtest, validate --url, rollout: what an HTTPS server's certificate is verified against (client/connection.py)
cacert_option = click.option(
    "--cacert",
    "ca_bundle",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PEM CA bundle an HTTPS server's certificate is verified against, as curl's --cacert (default: the "
    "system's trust store, which $SSL_CERT_FILE replaces)",
)


def _refuse_token(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value is not None:
        from ..serve.auth import TOKEN_ENV

        file = any(p.name == "config_path" for p in ctx.command.params)
        raise ConfigError(
            f"--token is refused: a token on the command line is seen by `ps` and kept in the shell's history; "
            f"set {TOKEN_ENV}{', or serve.token_file in -c,' if file else ''} instead"
        )


#: loadtest, rollout: ``--token VALUE`` is refused in one line (exit 2): the serve token is read from
#: VITDEPLOY_SERVE_TOKEN or serve.token_file alone (serve/auth.py's read_token), never from argv
token_refused_option = click.option("--token", hidden=True, expose_value=False, callback=_refuse_token)


@dataclass(frozen=True)
class Modes:
    """A command's two modes, switched by one option (``switch``, a parameter name): the options that go only
    with it (``switched``) and those that go only without it (``unswitched``), each with the line said when one
    is given in the other mode."""

    switch: str
    switched: tuple[str, ...] = ()
    switched_error: str = ""
    unswitched: tuple[str, ...] = ()
    unswitched_error: str = ""

    def check(self, ctx: click.Context) -> None:
        """ConfigError when an option of one mode is given in the other."""
        if _given(ctx, self.switch):
            names, error = self.unswitched, self.unswitched_error
        else:
            names, error = self.switched, self.switched_error
        if any(_given(ctx, name) for name in names):
            raise ConfigError(error)


def _given(ctx: click.Context, name: str) -> bool:
    """Whether the user gave the parameter (on the command line, or through its environment variable)."""
    return ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


class ModalCommand(click.Command):
    """A command with two modes: ``@click.command(name, cls=ModalCommand, modes=Modes(...))``."""

    def __init__(self, *args: Any, modes: Modes, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modes = modes

    def invoke(self, ctx: click.Context) -> Any:
        self.modes.check(ctx)
        return super().invoke(ctx)
