"""A job's logs the way ``mldist run`` shows them: the batch log, then every rank's lines prefixed ``[R]``.

Example::

    sources = lambda: log_sources(Path(record.output_dir), record.log_path())
    print_logs(sources())                       # mldist logs JOB
    follow_logs(sources, lambda: job_done())    # mldist logs JOB --follow
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ...base import untrusted
from ...errors import ConfigError

_RANK_LOG = re.compile(r"rank-([0-9]{1,7})\.log")
#: An array task's directory (see ``render.array_lines``).
_ARRAY_DIR = re.compile(r"array-([0-9]{1,9})")

#: (file, prefix for each of its lines)
Source = tuple[Path, str]


def log_sources(
    job_dir: Path, batch_log: Path, rank: int | None = None, array_log: Callable[[int], Path] | None = None
) -> list[Source]:
    """The batch log and every ``rank-R.log`` of ``job_dir`` in rank order, or rank ``rank``'s log alone.

    Args:
        job_dir: the job's output directory.
        batch_log: the batch script's log (not used for an array job).
        rank: only this rank's log (in every array task).
        array_log: for an array job, the batch log of task INDEX; each task's ranks log in
            ``array-INDEX/`` and its lines are prefixed ``[task I]`` / ``[task I rank R]``.

    Example:
        >>> log_sources(Path("/nonexistent"), Path("/nonexistent/job.out"))
        [(PosixPath('/nonexistent/job.out'), '')]
    """
    if array_log is None:
        return _task_sources(job_dir, batch_log, rank, "")
    found = []
    for index, task_dir in _numbered(job_dir, _ARRAY_DIR):
        found += _task_sources(task_dir, array_log(index), rank, f"task {index}")
    return found


def _numbered(folder: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """The entries of ``folder`` whose names match ``pattern`` (one number), by that number."""
    entries = []
    if os.path.isdir(folder):
        if why := untrusted.readable_dir(folder):  # another user's job: said, not taken for "no log yet"
            raise ConfigError(f"{folder} {why}")
        for path in folder.iterdir():
            match = pattern.fullmatch(path.name)
            if match:
                entries.append((int(match.group(1)), path))
    return sorted(entries)


def _task_sources(job_dir: Path, batch_log: Path, rank: int | None, label: str) -> list[Source]:
    tag = f"[{label}] " if label else ""
    if rank is not None:
        return [(job_dir / f"rank-{rank}.log", tag)]
    ranks = [(path, f"[{label + ' rank ' if label else ''}{r}] ") for r, path in _numbered(job_dir, _RANK_LOG)]
    return [(batch_log, tag), *ranks]


def _prefixed(text: str, prefix: str) -> str:
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def print_logs(sources: list[Source], out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> int:
    """Print each existing source's lines with its prefix; how many sources existed.

    A log that is there but cannot be read (another user's, mode 0600) is one line on ``err`` naming it.
    """
    found = 0
    for path, prefix in sources:
        if os.path.isfile(path):
            found += 1
            try:
                out.write(_prefixed(path.read_text(encoding="utf-8", errors="replace"), prefix))
            except OSError as exc:
                print(f"mldist logs: {path} cannot be read: {_why(path, exc)}", file=err, flush=True)
    out.flush()
    return found


def _why(path: Path, exc: OSError) -> str:
    return untrusted.denied(path) if isinstance(exc, PermissionError) else str(exc.strerror or exc)


class _Tail:
    """Complete new lines of one file since the last call."""

    def __init__(self) -> None:
        self.position, self.partial, self.refused = 0, "", False

    def read(self, path: Path, final: bool) -> str:
        if os.path.isfile(path) and not self.refused:
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    fh.seek(self.position)
                    self.partial += fh.read()
                    self.position = fh.tell()
            except OSError as exc:  # said once; the other logs go on
                self.refused = True
                print(f"mldist logs: {path} cannot be read: {_why(path, exc)}", file=sys.stderr, flush=True)
        if final:  # the job is over: a last line without a newline is printed too
            text, self.partial = self.partial, ""
            return text
        head, newline, rest = self.partial.rpartition("\n")
        if not newline:
            return ""
        self.partial = rest
        return head + newline


def follow_logs(
    sources: Callable[[], list[Source]],
    finished: Callable[[], bool],
    out: IO[str] = sys.stdout,
    poll: float = 0.5,
    check_every: float = 2.0,
) -> None:
    """Print every source's new lines (prefixed) as they arrive, until ``finished()`` and all is read.

    ``sources`` is called each round: ranks' logs that appear later are picked up.
    """
    tails: dict[Path, _Tail] = {}
    last_check, done = 0.0, False
    while True:
        wrote = False
        for path, prefix in sources():
            text = tails.setdefault(path, _Tail()).read(path, done)
            if text:
                out.write(_prefixed(text, prefix))
                wrote = True
        out.flush()
        if done and not wrote:
            return
        now = time.monotonic()
        if not done and now - last_check >= check_every:
            done, last_check = finished(), now
            continue
        if not wrote:
            time.sleep(poll)
