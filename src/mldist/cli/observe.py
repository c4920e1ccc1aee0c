"""Commands that look at runs: ``mldist tensorboard`` (TensorBoard over an ssh tunnel) and
``mldist stacks`` (where every rank of a running job is).

Example:
    $ mldist tensorboard runs/train-20261124-010203
    $ mldist tensorboard runs/* --login-host login.hpc.example.org
    $ mldist stacks 4242
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
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
lives says so: the rank is then likely in C code that holds Python's lock. Of a run that is over
(its summary.json is there, or its processes are gone) it says when and how it ended and shows
the last records as such; the exit code is then 1 unless the run ended ok."""


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


def _summary(folder: Path) -> dict[str, Any] | None:
    """The summary.json of the run whose progress folder is ``folder`` (it is written when the run
    ends), or None while the run goes on. A damaged one still says that the run ended."""
    for path in (folder / "summary.json", folder.parent / "summary.json"):
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = None
            return data if isinstance(data, dict) else {}
    return None


def _ended_at(summary: dict[str, Any]) -> float | None:
    """When the run ended (summary.json's ``ended``, seconds since the epoch), or None if it does not say."""
    try:
        return datetime.datetime.fromisoformat(str(summary["ended"])).timestamp()
    except (KeyError, ValueError):
        return None


def ending(target: str, summary: dict[str, Any], now: float) -> str:
    """The line that says a run is over: when and how it ended (its summary.json).

    Example:
        >>> ending("runs/t", {"ended": "2026-11-24T01:02:03+00:00", "status": "failed", "exit_code": 1},
        ...        datetime.datetime(2026, 11, 24, 1, 9, 3, tzinfo=datetime.timezone.utc).timestamp())[:73]
        'runs/t: this run ended at 2026-11-24 01:02:03+00:00 (7m00s ago), failed ('
    """
    from ..base.training import clock

    at = _ended_at(summary)
    when = "at an unknown time"
    if at is not None:
        stamp = datetime.datetime.fromisoformat(str(summary["ended"]))
        when = f"at {stamp.isoformat(sep=' ')} ({clock(max(0.0, now - at))} ago)"
    how = str(summary.get("status") or "with no status recorded")
    if summary.get("exit_code") is not None:
        how += f" (exit code {summary['exit_code']}"
        how += f", signals {', '.join(map(str, summary['signals']))})" if summary.get("signals") else ")"
    return (f"{target}: this run ended {when}, {how}; below are its ranks' last records, "
            "as they were then, not where anything is now")  # fmt: skip


def _cmd_stacks(args: argparse.Namespace) -> int:
    from ..base import progress

    shown, code, now = 0, 0, time.time()
    folders = _progress_folders(args.target)
    for folder in folders:
        records = progress.read(folder)
        if records and len(folders) > 1:  # an array job: one folder per task
            print(f"== {folder.parent.parent.name}", flush=True)
        summary = _summary(folder) if records else None
        gone = {rank for rank, record in records.items() if progress.gone(record)}
        if summary is not None:  # a run that is over: its records are history
            name = str(folder.parent.parent) if len(folders) > 1 else args.target
            print(f"mldist stacks: {ending(name, summary, now)}", file=sys.stderr, flush=True)
            code = max(code, 0 if summary.get("status") == "ok" else 1)
        elif records and gone == set(records):
            print(f"mldist stacks: {args.target}: no rank is running: their processes are gone and the run left "
                  "no summary.json (was its launcher killed?); below are their last records, as they were then",
                  file=sys.stderr, flush=True)  # fmt: skip
            code = 1
        ended = _ended_at(summary) if summary is not None else None
        for rank, record in records.items():
            past = summary is not None or rank in gone
            lines = progress.describe_past(record, ended, now) if past else progress.describe(record, now)
            print("\n".join(lines), flush=True)
            shown += 1
    if not shown:
        raise ConfigError(
            f"{args.target}: no rank has written its progress yet; is the job running? ({progress.NO_RECORD})"
        )
    return code


def _cmd_tensorboard(args: argparse.Namespace) -> int:
    from ..tools.tensorboard import serve

    return serve(args.run_dirs, port=args.port, login=args.login_host, local_port=args.local_port)
