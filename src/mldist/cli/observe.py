"""Commands that look at runs: ``mldist tensorboard`` (TensorBoard over an ssh tunnel) and
``mldist stacks`` (where every rank of a running job is).

Example:
    $ mldist tensorboard runs/train-20261124-010203
    $ mldist tensorboard runs/* --login-host login.hpc.example.org
    $ mldist stacks 4242
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import Handler, add_command, count

TENSORBOARD_EXAMPLE = """\
example:
  mldist tensorboard runs/train-20261124-010203     # prints: ssh -L PORT:localhost:PORT $USER@login-host
  mldist tensorboard runs/* --port 6006 --login-host login.hpc.example.org

TensorBoard listens on 127.0.0.1 only (it has no authentication); run the printed
ssh line on your own machine, then open http://localhost:PORT/. Ctrl-C stops it.
The login host comes from $SLURM_SUBMIT_HOST or $PBS_O_HOST inside a job, else this host."""

STACKS_EXAMPLE = """\
example:
  mldist stacks 4242                          # a batch job of mldist submit
  mldist stacks runs/train-20261126-101500    # an mldist run, by its run directory
  kill -QUIT PID                              # the same, printed by mldist run (PID: the launcher's)

About once a second every rank of mldist.init() writes where it is: the collective it is in
(number, name, for how long) or the last it finished, and its main thread's innermost frames.
This reads those records; the job keeps running. A record that stops changing while its rank
lives says so: the rank is then likely in C code that holds Python's lock."""


def register(sub: Any) -> dict[str, Handler]:
    """Add ``tensorboard`` to the subcommands; its handler by name."""
    board = add_command(
        sub,
        "tensorboard",
        "show run directories in TensorBoard on 127.0.0.1 and print the ssh tunnel to it",
        TENSORBOARD_EXAMPLE,
    )
    board.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (mldist run's --run-dir)")
    board.add_argument("--port", type=count(1, 65535), help="port on 127.0.0.1 (default: a free one)")
    board.add_argument("--local-port", type=count(1, 65535), help="port on your machine in the ssh line (default PORT)")
    board.add_argument("--login-host", help="the host you ssh to (default: the job's submit host, else this host)")
    stacks = add_command(
        sub,
        "stacks",
        "where every rank of a running job is: its collective and its Python frames",
        STACKS_EXAMPLE,
    )
    stacks.add_argument("target", metavar="JOB|RUN_DIR", help="a job id (mldist submit) or a run directory")
    return {"tensorboard": _cmd_tensorboard, "stacks": _cmd_stacks}


def _progress_folders(target: str) -> list[Path]:
    """The progress folders of ``target``: a run directory (or a job directory, or the folder itself),
    else a job of mldist submit (each array task's)."""
    where = Path(target)
    if where.is_dir():
        for folder in (where, where / "progress", where / "run" / "progress"):
            if any(folder.glob("rank-*.json")):
                return [folder]
        raise ConfigError(
            f"{target}: no progress records there (the run directory of a running job holds them in progress/; "
            "they come from mldist.init() with 2+ workers unless MLDIST_COLLECTIVE_TIMEOUT=0)"
        )
    from ..launch.batch.records import load_record
    from .jobs import JOB_ID

    if "/" in target or not JOB_ID.fullmatch(target):
        raise ConfigError(
            f"{target!r} is neither a run directory nor a job id (mldist stacks 4242, or a run directory)"
        )
    record = load_record(target)
    job_dir = Path(record.output_dir)
    return sorted(job_dir.glob("array-*/run/progress")) if record.array else [job_dir / "run" / "progress"]


def _cmd_stacks(args: argparse.Namespace) -> int:
    from ..base import progress

    shown = 0
    folders = _progress_folders(args.target)
    for folder in folders:
        records = progress.read(folder)
        if records and len(folders) > 1:  # an array job: one folder per task
            print(f"== {folder.parent.parent.name}", flush=True)
        for record in records.values():
            print("\n".join(progress.describe(record)), flush=True)
            shown += 1
    if not shown:
        raise ConfigError(
            f"{args.target}: no rank has written its progress yet; is the job running? ({progress.NO_RECORD})"
        )
    return 0


def _cmd_tensorboard(args: argparse.Namespace) -> int:
    from ..tools.tensorboard import serve

    return serve(args.run_dirs, port=args.port, login=args.login_host, local_port=args.local_port)
