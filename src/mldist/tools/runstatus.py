"""``mldist status RUN_DIR``: a run directory's state in one line, read from its files alone.

What ``mldist run`` and its workers leave in a run directory (:mod:`mldist.launch.rundir`) says
whether the run goes on and how it ended: ``config.json`` from the start (the launcher's pid and
host, the start time), ``summary.json`` from the end (status, exit code of the run and of each
rank, restarts, when), RunLog's ``training.json`` the progress of ``fit``
(:mod:`mldist.base.training`) and rank 0's ``straggler.json`` the slow-rank line
(:func:`mldist.runtime.watch.straggler_watch.status`). :func:`read` gathers them, :func:`line` (pure)
says them as the job form of ``mldist status`` does: no server, no network.

Example:
    >>> summary = {"status": "failed", "exit_code": 1, "exit_codes": [143, 1], "ended": "2026-11-24T01:02:03+00:00"}
    >>> run = RunFiles("runs/t", {}, summary, None, "", False)
    >>> line(run, datetime.datetime(2026, 11, 24, 1, 9, 3, tzinfo=datetime.timezone.utc).timestamp())
    'runs/t  FAILED  exit 1 (rank 1 exit 1)  ended 2026-11-24 01:02:03+00:00 (7m00s ago)'
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base import progress, training, untrusted
from ..base.untrusted import CODE, COUNT, ISO_TIME, PID, TEXT, Kind, either, fields_of, list_of, optional, whole
from ..errors import ConfigError
from ..runtime.watch import straggler_watch

#: The files that make a folder a run directory: mldist run's records and RunLog's progress.
MARKS = ("config.json", "summary.json", training.FILE)
#: How many failed ranks the line names (the others are counted).
NAMED_RANKS = 4
#: What the fields of config.json that the line uses may hold.
CONFIG_FIELDS = {"launcher": fields_of({"pid": PID}), "host": TEXT, "started": ISO_TIME}
#: What the fields of summary.json that the line uses may hold (signals: names, or numbers of old files).
SUMMARY_FIELDS = {
    "status": TEXT,
    "exit_code": CODE,
    "exit_codes": list_of(optional(CODE)),
    "restarts": COUNT,
    "signals": list_of(Kind("a signal name or number", either(TEXT, whole(1, 64)).ok)),
    "error": TEXT,
    "started": ISO_TIME,
    "ended": ISO_TIME,
}
#: The key of :attr:`RunFiles.problems` for the directory itself.
FOLDER = ""


@dataclass(frozen=True)
class RunFiles:
    """What a run directory holds for ``mldist status`` (None where a file is missing or unreadable).

    Args:
        path: the directory, as the user named it.
        config: config.json (the launcher's record of the start).
        summary: summary.json (the end; ``{}`` when it is there but damaged: the run ended all the same).
        progress: training.json (RunLog on rank 0).
        slow: the slow-rank text of :func:`mldist.runtime.watch.straggler_watch.status` ("" when none).
        launcher_gone: config.json names a launcher on this host whose process is gone.
        problems: file name ("" for the directory) -> the line that says why it is there but cannot be used
            (another user's, damaged): its content is then None, never guessed.
    """

    path: str
    config: dict[str, Any] | None
    summary: dict[str, Any] | None
    progress: dict[str, Any] | None
    slow: str
    launcher_gone: bool
    problems: Mapping[str, str] = field(default_factory=dict)


def _marked(folder: Path) -> bool:
    try:
        return any((folder / name).is_file() for name in MARKS)
    except OSError:  # a folder this user may not enter: not known to be one
        return False


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
    if shut := _shut(target):
        return shut
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
    problems: dict[str, str] = {}

    def take(name: str, load: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
        try:
            return load()
        except untrusted.Unusable as exc:  # there, but of no use: said, never taken for missing
            problems[name] = str(exc)
            return None

    summary = take("summary.json", lambda: untrusted.load(where / "summary.json", SUMMARY_FIELDS))
    config = take("config.json", lambda: untrusted.load(where / "config.json", CONFIG_FIELDS))
    rec = take(training.FILE, lambda: training.load(where))
    ended = summary is not None or "summary.json" in problems
    gone = not ended and config is not None and _launcher_gone(config)
    return RunFiles(target, config, summary, rec, straggler_watch.status(where), gone, problems)


def _shut(target: str) -> RunFiles | None:
    """The RunFiles of a directory this user may not read (another user's 0700 run), else None."""
    why = untrusted.readable_dir(target)
    return RunFiles(target, None, None, None, "", False, {FOLDER: f"{target} {why}"}) if why else None


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
    left = dict(run.problems)
    if FOLDER in left:  # nothing else can be known
        return f"{run.path}  UNREADABLE  {left[FOLDER]}"
    head = _head(run, left, now)
    ended = run.summary is not None or "summary.json" in run.problems or run.launcher_gone
    if run.progress is not None:
        shown = "  " + training.describe(run.progress, now=now, ended=ended)
    elif training.FILE in left:
        shown = "  " + left.pop(training.FILE)
    else:
        shown = "" if ended else "  (no training progress yet)"
    rest = "".join(f"; {why}" for why in left.values())  # a damaged config.json of a run that ended, say
    return f"{run.path}  {head}{shown}{run.slow}{rest}"


def _head(run: RunFiles, left: dict[str, str], now: float) -> str:
    """The state and how or since when; the problem it says is taken out of ``left``."""
    config = run.config or {}
    if run.summary is not None:
        return _ending(run.summary, now)
    if "summary.json" in left:  # there: the run ended; how, its file cannot say
        return f"ENDED  how is unknown: {left.pop('summary.json')}"
    if run.launcher_gone:
        pid = config["launcher"]["pid"]
        return f"GONE  its launcher (pid {pid}) is gone and left no summary.json (was it killed?)"
    if "config.json" in left:
        return f"UNKNOWN  {left.pop('config.json')}"
    if run.config is None:
        return "UNKNOWN  no config.json: not started by mldist run (RunLog's own, or a batch job's: mldist status JOB)"
    started = _when(config.get("started"), now)
    return "RUNNING" + (f"  started {started}" if started else "")
