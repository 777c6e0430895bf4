"""The `vitdeploy` command: the group, its logging, and one line per command; each command lives in a module of
its own, which only parses, calls one library function and prints.

Every error is mapped once, by the group itself (``errors.ErrorMappingGroup``): a VitDeployError becomes one line
on stderr and its exit code (2 usage/config, 3 validation failed, 4 required stage unavailable, 1 other); a user
never sees a traceback for their own mistake (``VITDEPLOY_DEBUG=1`` shows it).
"""

from __future__ import annotations

import logging

import click

from ..base.version import __version__
from . import batch, bench, export, info, load, predict, report, rollout, serve, sign, triton, validate
from .console import CONSOLE, ConsoleLogHandler
from .errors import ErrorMappingGroup


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * verbose
    handler = ConsoleLogHandler(CONSOLE)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=max(level, logging.DEBUG), handlers=[handler])


@click.group(cls=ErrorMappingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vitdeploy")
@click.option("-v", "--verbose", count=True, help="more logging on stderr (-v info, -vv debug)")
def main(verbose: int) -> None:
    """Take a PyTorch Vision Transformer to production: validated ONNX with a dynamic batch, an FP16
    TensorRT engine, a manifest, and one runtime for every backend."""
    _setup_logging(verbose)


#: Every command of `vitdeploy`, one line each (the group lists them by name in --help).
COMMANDS: tuple[click.Command, ...] = (
    info.info,
    info.config_group,
    export.export,
    predict.predict,
    batch.batch_predict,
    validate.validate,
    bench.bench,
    report.report_cmd,
    serve.serve,
    triton.triton_repo,
    load.loadtest,
    load.tune,
    rollout.rollout,
    sign.sign,
)
for _command in COMMANDS:
    main.add_command(_command)

if __name__ == "__main__":  # pragma: no cover
    main()
