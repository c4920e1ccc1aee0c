"""``mldist status RUN_DIR``: a run directory's state in one line, read from its files alone.

What ``mldist run`` and its workers leave in a run directory (:mod:`mldist.launch.rundir`) says
whether the run goes on and how it ended: ``config.json`` from the start (the launcher's pid and
host, the start time), ``summary.json`` from the end (status, exit code of the run and of each
rank, restarts, when), RunLog's ``training.json`` the progress of ``fit``
(:mod:`mldist.base.training`) and rank 0's ``straggler.json`` the slow-rank line
(:func:`mldist.runtime.straggler_watch.status`). :func:`read` gathers them, :func:`line` (pure)
says them as the job form of ``mldist status`` does: no server, no network.

Example:
    >>> summary = {"status": "failed", "exit_code": 1, "exit_codes": [143, 1], "ended": "2026-11-24T01:02:03+00:00"}
    >>> run = RunFiles("runs/t", {}, summary, None, "", False)
    >>> line(run, datetime.datetime(2026, 11, 24, 1, 9, 3, tzinfo=datetime.timezone.utc).timestamp())
    'runs/t  FAILED  exit 1 (rank 1 exit 1)  ended 2026-11-24 01:02:03+00:00 (7m00s ago)'
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import progress, training
from ..errors import ConfigError
from ..runtime import straggler_watch

#: The files that make a folder a run directory: mldist run's records and RunLog's progress.
MARKS = ("config.json", "summary.json", training.FILE)
#: How many failed ranks the line names (the others are counted).
NAMED_RANKS = 4


@dataclass(frozen=True)
class RunFiles:
    """What a run directory holds for ``mldist status`` (None where a file is missing or unreadable).

    Args:
        path: the directory, as the user named it.
        config: config.json (the launcher's record of the start).
        summary: summary.json (the end; ``{}`` when it is there but damaged: the run ended all the same).
        progress: training.json (RunLog on rank 0).
        slow: the slow-rank text of :func:`mldist.runtime.straggler_watch.status` ("" when none).
        launcher_gone: config.json names a launcher on this host whose process is gone.
    """

    path: str
    config: dict[str, Any] | None
    summary: dict[str, Any] | None
    progress: dict[str, Any] | None
    slow: str
    launcher_gone: bool


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _marked(folder: Path) -> bool:
    return any((folder / name).is_file() for name in MARKS)


def read(target: str) -> RunFiles:
    """The files of the run directory ``target``; a ConfigError naming the fix when it is none.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = (Path(folder) / "config.json").write_text('{"started": "2026-11-24T01:02:03+00:00"}')
        ...     found = read(folder)
        >>> found.summary is None, found.config
        (True, {'started': '2026-11-24T01:02:03+00:00'})
    """
    where = Path(target)
    if not where.is_dir():
        folder = where.parent if _marked(where.parent) else "runs/train-20261124-010203"
        raise ConfigError(f"{target} is a file, not a run directory; give the folder, e.g. mldist status {folder}")
    if not _marked(where):
        try:
            inside = sorted(str(p) for p in where.iterdir() if p.is_dir() and _marked(p))
        except OSError:
            inside = []
        n = len(inside)  # the runs folder itself, say: name its newest run
        held = f"; it holds {n} run director{'y' if n == 1 else 'ies'}, e.g. mldist status {inside[-1]}" if n else ""
        marks = f"{', '.join(MARKS[:-1])} or {MARKS[-1]}"
        why = "mldist run makes one per run, runs/<script>-<time>/, unless --no-run-dir"
        raise ConfigError(f"{target} is not a run directory: none of {marks} is there ({why}){held}")
    summary = None
    if (where / "summary.json").is_file():
        summary = _json(where / "summary.json") or {}
    config = _json(where / "config.json")
    gone = summary is None and config is not None and _launcher_gone(config)
    return RunFiles(target, config, summary, training.read(where), straggler_watch.status(where), gone)


def _launcher_gone(config: Mapping[str, Any]) -> bool:
    """Whether config.json's launcher ran on this host and no process has its pid now."""
    launcher, host = config.get("launcher"), config.get("host")
    pid = launcher.get("pid") if isinstance(launcher, dict) else None
    return isinstance(host, str) and isinstance(pid, int) and progress.process_gone(host, pid)


def _when(stamp: Any, now: float) -> str:
    """``2026-11-24 01:02:03+00:00 (7m00s ago)`` for an ISO time of the records; "" when there is none."""
    try:
        at = datetime.datetime.fromisoformat(str(stamp))
    except ValueError:
        return ""
    return f"{at.isoformat(sep=' ')} ({training.clock(max(0.0, now - at.timestamp()))} ago)"


def failed_ranks(summary: Mapping[str, Any]) -> str:
    """The ranks that ended with the run's exit code (the first failure's; the others were stopped).

    Example:
        >>> failed_ranks({"exit_code": 3, "exit_codes": [143, 3, 0]}), failed_ranks({"exit_code": 0})
        ('rank 1 exit 3', '')
    """
    code, codes = summary.get("exit_code"), summary.get("exit_codes")
    if not code or not isinstance(codes, list):
        return ""
    ranks = [rank for rank, own in enumerate(codes) if own == code]
    if not ranks or len(ranks) == len(codes) > 1:  # every rank alike: nobody to name
        return ""
    named = ", ".join(map(str, ranks[:NAMED_RANKS]))
    if len(ranks) > NAMED_RANKS:
        named += f" and {len(ranks) - NAMED_RANKS} more"
    return f"rank{'s' if len(ranks) > 1 else ''} {named} exit {code}"


def _ending(summary: Mapping[str, Any], now: float) -> str:
    """``FAILED  exit 3 (rank 1 exit 3)  ended ... (7m00s ago)``: how and when the run ended."""
    state = str(summary.get("status") or "ended").upper()
    how = f"exit {summary['exit_code']}" if summary.get("exit_code") is not None else "no exit code recorded"
    details = [failed_ranks(summary)]
    if summary.get("signals"):  # to the launcher: Ctrl-C, scancel
        details.append(f"signals {', '.join(map(str, summary['signals']))}")
    details.append(str(summary.get("error") or ""))  # the launcher's own failure
    if shown := "; ".join(filter(None, details)):
        how += f" ({shown})"
    if summary.get("restarts"):
        how += f" restarts {summary['restarts']}"
    when = _when(summary.get("ended"), now)
    return f"{state}  {how}" + (f"  ended {when}" if when else "")


def line(run: RunFiles, now: float | None = None) -> str:
    """The run's state in one line: the directory, running or how it ended, its progress, the slow rank.

    Args:
        run: what :func:`read` found.
        now: the time (seconds since the epoch; default: now).
    """
    now = time.time() if now is None else now
    config = run.config or {}
    started = _when(config.get("started"), now)
    if run.summary is not None:
        head = _ending(run.summary, now)
    elif run.launcher_gone:
        pid = config["launcher"]["pid"]
        head = f"GONE  its launcher (pid {pid}) is gone and left no summary.json (was it killed?)"
    elif run.config is None:
        head = "UNKNOWN  no config.json: not started by mldist run (RunLog's own, or a batch job's: mldist status JOB)"
    else:
        head = "RUNNING" + (f"  started {started}" if started else "")
    ended = run.summary is not None or run.launcher_gone
    if run.progress is not None:
        shown = "  " + training.describe(run.progress, now=now, ended=ended)
    else:
        shown = "" if ended else "  (no training progress yet)"
    return f"{run.path}  {head}{shown}{run.slow}"
