"""Commands that run on this host: ``mldist run`` (N local workers) and ``mldist env``.

Example:
    $ mldist run -n 2 -- python train.py
    $ mldist env --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
from collections.abc import Collection
from typing import Any

from ..errors import ConfigError
from .common import Handler, add_command, command_after_dashes, count, seconds

RUN_EXAMPLE = """\
example:
  mldist run -n 2 -- python train.py --epochs 5
  mldist run -n 4 --log-dir logs/ python train.py
  mldist run -n 2 --run-dir runs/try1 -- python train.py   # then: mldist tensorboard runs/try1
  mldist run -n 2 --max-restarts 3 python train.py   # resumes from mldist.keras.Checkpoint
  mldist run -np 2 -H localhost:2 python train.py     # horovodrun's flags work too

Each worker gets MLDIST_RANK, MLDIST_SIZE, MLDIST_LOCAL_RANK, MLDIST_LOCAL_SIZE
and MLDIST_WORKERS; mldist.init() reads them. If one worker fails the others
are stopped and the exit code is that worker's (128+N for signal N); exit
code 75 means the workers saved a checkpoint and ask to be started again.
Every run leaves a run directory (MLDIST_RUN_DIR for the workers): config.json,
rank-R.log, the metrics of mldist.keras.RunLog and summary.json at the end."""

ENV_EXAMPLE = """\
example:
  mldist env            # what this process would be
  srun -n 2 mldist env --json   # what each task of a Slurm step sees"""


def _add_horovodrun_flags(run: Any) -> None:
    """horovodrun's -H, --gloo and --mpi (its -np is an alias of -n)."""
    run.add_argument(
        "-H", "--hosts", help="horovodrun's host:slots list; this host only (e.g. localhost:2): sets -n if absent"
    )
    engine = run.add_mutually_exclusive_group()
    engine.add_argument("--gloo", action="store_true", help="horovodrun's flag: TensorFlow's RING engine")
    engine.add_argument("--mpi", action="store_true", help="horovodrun's flag: the MPI engine")


def _add_output_flags(run: Any) -> None:
    """--log-dir, the run directory's --run-dir / --no-run-dir, --verbose and --profile-steps."""
    run.add_argument("--log-dir", help="write one rank-R.log per worker here instead of prefixed output")
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--run-dir",
        metavar="DIR",
        help="keep config.json, rank-R.log, metrics and summary.json here (default runs/<script>-<time>)",
    )
    where.add_argument("--no-run-dir", action="store_true", help="write no run directory")
    run.add_argument("--verbose", "-v", action="store_true", help="show TensorFlow's start-up notices of every rank")
    run.add_argument(
        "--profile-steps",
        type=_step_range,
        default=os.environ.get("MLDIST_PROFILE_STEPS") or None,
        metavar="A:B",
        help="record a timeline of train steps A..B on every rank: trace/rank-R and trace/merged.trace.json.gz",
    )


def register(sub: Any) -> dict[str, Handler]:
    """Add ``run`` and ``env`` to the subcommands; their handlers by name."""
    run = add_command(
        sub,
        "run",
        "start N workers of a training script on this host",
        RUN_EXAMPLE,
        "Start N workers of COMMAND on this host, all-or-nothing.",
    )
    run.add_argument("-n", "-np", "--nprocs", type=count(1, 4096), help="number of workers (-np as in horovodrun)")
    _add_horovodrun_flags(run)
    _add_output_flags(run)
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
        type=count(0, 1000),
        default=0,
        help="after a worker failure, restart the group up to K times (resumes from mldist checkpoints)",
    )
    run.add_argument(
        "--communication",
        choices=("auto", "mpi", "ring", "nccl"),
        default=os.environ.get("MLDIST_COMMUNICATION", "auto"),
        help="collective engine: auto (MPI on CPUs through mpiexec when available, NCCL on GPUs, else RING)",
    )
    run.add_argument(
        "--network",
        choices=("auto", "private", "host"),
        default="auto",
        help="TensorFlow's engines: 'private' runs the workers in their own network namespace (unreachable "
        "from elsewhere, no other network), 'host' on this host's; auto: private where allowed",
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


_HOST_SLOTS = re.compile(r"([A-Za-z0-9_.-]+)(?::([0-9]{1,4}))?")


_STEP_RANGE = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")


def _step_range(text: str) -> str:
    """``A:B`` with A <= B (train steps counted from 0)."""
    match = _STEP_RANGE.fullmatch(text)
    if not match or int(match.group(1)) > int(match.group(2)):
        raise argparse.ArgumentTypeError(f"{text!r}: write FIRST:LAST with FIRST <= LAST, e.g. 10:12")
    return text


def local_slots(hosts: str, local_names: Collection[str]) -> int:
    """The worker count of a horovodrun ``-H host:slots,...`` list naming only this host.

    Example:
        >>> local_slots("localhost:2", {"localhost"})
        2
        >>> local_slots("localhost", {"localhost"})
        1
    """
    total = 0
    for item in hosts.split(","):
        match = _HOST_SLOTS.fullmatch(item)
        if not match:
            raise ConfigError(f"-H {hosts!r}: write host:slots,... (e.g. localhost:2)")
        host, slots = match.group(1), int(match.group(2) or 1)
        if host not in local_names:
            raise ConfigError(
                f"-H {hosts!r}: {host} is not this host; mldist run starts workers here only. "
                "For several nodes use mldist submit, srun or mpiexec"
            )
        total += slots
    if total < 1:
        raise ConfigError(f"-H {hosts!r} gives no slots")
    return total


def _this_host() -> set[str]:
    return {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}


def _nprocs_and_engine(args: argparse.Namespace) -> tuple[int, str]:
    """-n/-np, or horovodrun's -H; --gloo/--mpi as --communication."""
    nprocs = args.nprocs
    if args.hosts is not None:
        slots = local_slots(args.hosts, _this_host())
        if nprocs is not None and nprocs != slots:
            raise ConfigError(f"-np {nprocs} but -H {args.hosts!r} gives {slots} slots; make them agree")
        nprocs = slots
    if nprocs is None:
        raise ConfigError("say how many workers: mldist run -n 2 -- python train.py")
    engine = "ring" if args.gloo else "mpi" if args.mpi else args.communication
    return nprocs, engine


def _cmd_run(args: argparse.Namespace) -> int:
    from ..launch.local import RunConfig, run
    from ..launch.rundir import default_run_dir

    nprocs, engine = _nprocs_and_engine(args)
    command = tuple(command_after_dashes(args.cmd, "mldist run -n 2 -- python train.py"))
    cfg = RunConfig(
        nprocs=nprocs,
        command=command,
        log_dir=args.log_dir,
        grace=args.grace,
        failure_grace=args.failure_grace,
        cpu_bind=args.cpu_bind,
        max_restarts=args.max_restarts,
        communication=engine,
        network=args.network,
        verbose=args.verbose,
        profile_steps=args.profile_steps,
        run_dir=None if args.no_run_dir else args.run_dir or str(default_run_dir(command)),
    )
    return run(cfg)


def _cmd_env(args: argparse.Namespace) -> int:
    from ..tools.report import build_report, format_report

    report = build_report(os.environ, with_tensorflow=not args.no_tensorflow)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
    return 0
