"""The ``mldist`` command line (also ``python -m mldist``).

Bad input gets one clear line on stderr and exit code 2, never a traceback.

Example:
    $ mldist run -n 2 -- python train.py
    $ mldist env --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from .errors import MldistError


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not at least {minimum}")
        return value

    return parse


_positive_int = _int_at_least(1)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value:g} is negative")
    return value


RUN_EXAMPLE = """\
example:
  mldist run -n 2 -- python train.py --epochs 5
  mldist run -n 4 --log-dir logs/ python train.py
  mldist run -n 2 --max-restarts 3 python train.py   # resumes from mldist.keras.Checkpoint

Each worker gets MLDIST_RANK, MLDIST_SIZE, MLDIST_LOCAL_RANK, MLDIST_LOCAL_SIZE
and MLDIST_WORKERS; mldist.init() reads them. If one worker fails the others
are stopped and the exit code is that worker's (128+N for signal N); exit
code 75 means the workers saved a checkpoint and ask to be started again."""

ENV_EXAMPLE = """\
example:
  mldist env            # what this process would be
  srun -n 2 mldist env --json   # what each task of a Slurm step sees"""


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mldist",
        description="Data-parallel TensorFlow/Keras on workstations and HPC clusters.",
        epilog="example:\n  mldist run -n 2 -- python train.py\n  mldist submit --nodes 2 -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"mldist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    run = sub.add_parser(
        "run",
        help="start N workers of a training script on this host",
        description="Start N workers of COMMAND on this host, all-or-nothing.",
        epilog=RUN_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("-n", "--nprocs", type=_positive_int, required=True, help="number of workers")
    run.add_argument("--log-dir", help="write one rank-R.log per worker here instead of prefixed output")
    run.add_argument(
        "--grace",
        type=_seconds,
        default=60.0,
        help="seconds workers get to save and exit after SIGINT/SIGTERM (default 60)",
    )
    run.add_argument(
        "--failure-grace",
        type=_seconds,
        default=5.0,
        help="seconds the others get after one worker failed (default 5)",
    )
    run.add_argument(
        "--cpu-bind",
        choices=("none", "cores"),
        default="none",
        help="'cores' gives each worker its own share of this process's CPUs",
    )
    run.add_argument(
        "--max-restarts",
        type=_int_at_least(0),
        default=0,
        help="after a worker failure, restart the group up to K times (resumes from mldist checkpoints)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND", help="the worker command")

    env = sub.add_parser(
        "env",
        help="show what mldist detects and what mldist.init() would set",
        description="Show the launcher, ranks, workers, threads, GPUs and versions.",
        epilog=ENV_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env.add_argument("--json", action="store_true", help="print JSON")
    env.add_argument("--no-tensorflow", action="store_true", help="skip the GPU query (no TF import)")
    from .cli_jobs import add_commands

    _COMMANDS.update(add_commands(sub, argparse.RawDescriptionHelpFormatter))
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from .launch import RunConfig, run

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise _UsageError("run", "missing COMMAND, e.g. mldist run -n 2 -- python train.py")
    cfg = RunConfig(
        nprocs=args.nprocs,
        command=tuple(cmd),
        log_dir=args.log_dir,
        grace=args.grace,
        failure_grace=args.failure_grace,
        cpu_bind=args.cpu_bind,
        max_restarts=args.max_restarts,
    )
    return run(cfg)


def _cmd_env(args: argparse.Namespace) -> int:
    from .report import build_report, format_report

    report = build_report(os.environ, with_tensorflow=not args.no_tensorflow)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
    return 0


class _UsageError(Exception):
    def __init__(self, command: str, message: str) -> None:
        super().__init__(f"mldist {command}: error: {message}")


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"run": _cmd_run, "env": _cmd_env}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
    """
    args = _build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except MldistError as exc:
        print(f"mldist {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
