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
import functools
import os
import re
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..base import untrusted
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
the last records as such; the exit code is then 1 unless the run ended ok. In a job of more than
8 ranks, ranks at one place with the same frames are one block ("16,383 ranks (0-16, 18-16383) in
collective #58 allreduce(sum) for 12-13 s"), the others follow whole; --all shows every rank."""


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
    stacks.add_argument(
        "--all", action="store_true", help="every rank by itself (default: ranks at one place with one stack folded)"
    )
    return {"tensorboard": _cmd_tensorboard, "stacks": _cmd_stacks}


def _progress_folders(target: str) -> list[Path]:
    """The progress folders of ``target``: a run directory (or a job directory, or the folder itself),
    else a job of mldist submit (each array task's)."""
    from ..base import progress

    where = Path(target)
    if where.is_dir():
        _readable(where)
        for folder in (where, where / "progress", where / "run" / "progress"):
            _readable(folder)
            if progress.has_records(folder):
                return [folder]
        if (ended := _ended_run(target)) is not None:
            raise ended
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


class _RunEnded(Exception):
    """A run directory without progress records whose run is over: the line that says how it ended."""

    def __init__(self, line: str, code: int = 1) -> None:
        super().__init__(line)
        self.line, self.code = line, code


def _ended_run(target: str) -> _RunEnded | None:
    """How the run of directory ``target`` ended (``mldist status``'s line, exit code 0 when ok), or None while
    it goes on (or when ``target`` is no run directory)."""
    from ..tools import runstatus

    try:
        run = runstatus.read(target)
    except ConfigError:
        return None
    if run.summary is None and not run.launcher_gone:
        return None
    ok = run.summary is not None and run.summary.get("status") == "ok"
    return _RunEnded(f"{runstatus.line(run)} (the run is over; no progress records were kept)", 0 if ok else 1)


def _readable(folder: Path) -> None:
    """A ConfigError naming ``folder`` and why when it is there but this user may not read it (another's run)."""
    if os.path.isdir(folder) and (why := untrusted.readable_dir(folder)):
        raise ConfigError(f"{folder} {why}")


#: The key of a summary that is there but of no use: the line that says why (see :func:`_summary`).
UNUSABLE = "mldist_unusable"


def _summary(folder: Path) -> dict[str, Any] | None:
    """The summary.json of the run whose progress folder is ``folder`` (it is written when the run
    ends), or None while the run goes on. A damaged or unreadable one still says that the run ended,
    and why it says no more (:data:`UNUSABLE`)."""
    from ..tools.runstatus import SUMMARY_FIELDS

    for path in (folder / "summary.json", folder.parent / "summary.json"):
        try:
            data = untrusted.load(path, SUMMARY_FIELDS)
        except untrusted.Unusable as exc:
            return {UNUSABLE: str(exc)}
        if data is not None:
            return data
    return None


def _sane(record: Any) -> bool:
    """Whether a progress record's pid and times are within reason (a damaged one's 1e300 would not format)."""
    times = [record.written, *(t[2] for t in (record.current, record.last) if t)]
    return untrusted.PID.ok(record.pid) and all(map(untrusted.UNIX_TIME.ok, times))


def _unused(folder: Path, used: Collection[int]) -> str:
    """One line for the progress files in ``folder`` that are there but of no use ("" when none)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except OSError as exc:
        return "" if isinstance(exc, FileNotFoundError) else f"{folder} {untrusted.readable_dir(folder) or exc}"
    bad = []
    for name in names:
        rank = re.fullmatch(r"rank-([0-9]{1,7})\.json", name)
        if rank and int(rank.group(1)) in used:
            continue
        try:
            if untrusted.load(folder / name) is not None and rank:  # JSON, but not a record of its rank
                bad.append(f"{folder / name} is damaged: not a progress record (a field of a wrong type or range)")
        except untrusted.Unusable as exc:
            bad.append(str(exc))
    more = f" (and {len(bad) - 1} more of its files)" if len(bad) > 1 else ""
    return f"{bad[0]}{more}" if bad else ""


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
    if UNUSABLE in summary:  # there, so the run ended; nothing more is known
        return f"{target}: this run ended (its summary.json is there), how is unknown: {summary[UNUSABLE]}"
    how = str(summary.get("status") or "with no status recorded")
    if summary.get("exit_code") is not None:
        how += f" (exit code {summary['exit_code']}"
        how += f", signals {', '.join(map(str, summary['signals']))})" if summary.get("signals") else ")"
    return (
        f"{target}: this run ended {when}, {how}; below are its ranks' last records, "
        "as they were then, not where anything is now"
    )


def _describe(record: Any, past: Collection[int], ended: float | None, now: float) -> list[str]:
    """One rank's block: as history when its run is over or its process gone (``past``), else live."""
    from ..base import progress

    return progress.describe_past(record, ended, now) if record.rank in past else progress.describe(record, now)


def _cmd_stacks(args: argparse.Namespace) -> int:
    from ..base import progress, stacks

    shown, code, now, unusable = 0, 0, time.time(), []
    try:
        folders = _progress_folders(args.target)
    except _RunEnded as over:  # a run over that left no records: how it ended, from its files
        print(f"mldist stacks: {over.line}", file=sys.stderr, flush=True)
        return over.code
    for folder in folders:
        records = {rank: record for rank, record in progress.read(folder).items() if _sane(record)}
        if (bad := _unused(folder, records)) and records:  # some ranks' records only: the others are shown
            print(f"mldist stacks: {bad}", file=sys.stderr, flush=True)
            code = 1
        elif bad:
            unusable.append(bad)
        if records and len(folders) > 1:  # an array job: one folder per task
            print(f"== {folder.parent.parent.name}", flush=True)
        summary = _summary(folder) if records else None
        gone = {rank for rank, record in records.items() if progress.gone(record)}
        if summary is not None:  # a run that is over: its records are history
            name = str(folder.parent.parent) if len(folders) > 1 else args.target
            print(f"mldist stacks: {ending(name, summary, now)}", file=sys.stderr, flush=True)
            code = max(code, 0 if summary.get("status") == "ok" else 1)
        elif records and gone == set(records):
            print(
                f"mldist stacks: {args.target}: no rank is running: their processes are gone and the run left "
                "no summary.json (was its launcher killed?); below are their last records, as they were then",
                file=sys.stderr,
                flush=True,
            )
            code = 1
        ended = _ended_at(summary) if summary is not None else None
        past = set(records) if summary is not None else gone
        describe = functools.partial(_describe, past=past, ended=ended, now=now)
        print("\n".join(stacks.grouped(records, describe, now, every=args.all)), flush=True)
        shown += len(records)
    if not shown and unusable:  # records are there, of no use: not "no rank has written"
        raise ConfigError(unusable[0])
    if not shown:
        raise ConfigError(
            f"{args.target}: no rank has written its progress yet; is the job running? ({progress.NO_RECORD})"
        )
    return code


def _cmd_tensorboard(args: argparse.Namespace) -> int:
    from ..tools.tensorboard import serve

    return serve(args.run_dirs, port=args.port, login=args.login_host, local_port=args.local_port)
