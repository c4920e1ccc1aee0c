"""Commands that run on this host: ``mldist run`` (N local workers) and ``mldist env``.

Example:
    $ mldist run -n 2 -- python train.py
    $ mldist env --json
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .common import Handler, add_command, command_after_dashes, count, seconds

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


def register(sub: Any) -> dict[str, Handler]:
    """Add ``run`` and ``env`` to the subcommands; their handlers by name."""
    run = add_command(
        sub,
        "run",
        "start N workers of a training script on this host",
        RUN_EXAMPLE,
        "Start N workers of COMMAND on this host, all-or-nothing.",
    )
    run.add_argument("-n", "--nprocs", type=count(1), required=True, help="number of workers")
    run.add_argument("--log-dir", help="write one rank-R.log per worker here instead of prefixed output")
    run.add_argument(
        "--grace",
        type=seconds,
        default=60.0,
        help="seconds workers get to save and exit after SIGINT/SIGTERM (default 60)",
    )
    run.add_argument(
        "--failure-grace", type=seconds, default=5.0, help="seconds the others get after one worker failed (default 5)"
    )
    run.add_argument(
        "--cpu-bind",
        choices=("none", "cores"),
        default="none",
        help="'cores' gives each worker its own share of this process's CPUs",
    )
    run.add_argument(
        "--max-restarts",
        type=count(0),
        default=0,
        help="after a worker failure, restart the group up to K times (resumes from mldist checkpoints)",
    )
    run.add_argument(
        "--communication",
        choices=("auto", "mpi", "ring", "nccl"),
        default=os.environ.get("MLDIST_COMMUNICATION", "auto"),
        help="collective engine: auto (MPI on CPUs through mpiexec when available, NCCL on GPUs, else RING)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND", help="the worker command")
    env = add_command(
        sub,
        "env",
        "show what mldist detects and what mldist.init() would set",
        ENV_EXAMPLE,
        "Show the launcher, ranks, workers, threads, GPUs and versions.",
    )
    env.add_argument("--json", action="store_true", help="print JSON")
    env.add_argument("--no-tensorflow", action="store_true", help="skip the GPU query (no TF import)")
    return {"run": _cmd_run, "env": _cmd_env}


def _cmd_run(args: argparse.Namespace) -> int:
    from ..launch.local import RunConfig, run

    cfg = RunConfig(
        nprocs=args.nprocs,
        command=tuple(command_after_dashes(args.cmd, "mldist run -n 2 -- python train.py")),
        log_dir=args.log_dir,
        grace=args.grace,
        failure_grace=args.failure_grace,
        cpu_bind=args.cpu_bind,
        max_restarts=args.max_restarts,
        communication=args.communication,
    )
    return run(cfg)


def _cmd_env(args: argparse.Namespace) -> int:
    from ..tools.report import build_report, format_report

    report = build_report(os.environ, with_tensorflow=not args.no_tensorflow)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
    return 0
