"""The ``mldist`` command line (also ``python -m mldist``): argparse only.

One module per command group registers its subcommands (``run``: run, env;
``jobs``: submit, status, cancel, logs; ``buildenv``: build-env; ``tools``: doctor;
``bench``: bench; ``observe``: tensorboard; ``data``: data); ``common`` holds the shared
parser pieces. Bad input gets one clear line on stderr and exit code 2, never a traceback.

Example:
    $ mldist run -n 2 -- python train.py
    $ mldist env --json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import MldistError
from . import bench, buildenv, data, jobs, observe, run, tools
from .common import FORMATTER, Handler, Parser

#: Command groups, in ``mldist --help`` order.
GROUPS = (run, jobs, buildenv, tools, bench, observe, data)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The top-level parser and every subcommand's handler by name."""

    parser = Parser(
        prog="mldist",
        description="Data-parallel TensorFlow/Keras on workstations and HPC clusters.",
        epilog="example:\n  mldist run -n 2 -- python train.py\n  mldist submit --nodes 2 -- python train.py",
        formatter_class=FORMATTER,
    )
    parser.add_argument("--version", action="version", version=f"mldist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    handlers: dict[str, Handler] = {}
    for group in GROUPS:
        handlers.update(group.register(sub))
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
    """
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    try:
        return handlers[args.command](args)
    except MldistError as exc:
        print(f"mldist {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
