"""The workers' output as the launcher relays it: tidy lines, and the run directory's ``rank-R.log`` files.

A worker's output is the job's own: it never ends the job. A log that cannot be written (a full
disk, a quota) stops, the terminal keeps every line, and the launcher says once which files
stopped and why (:class:`RunLogs`). Lines drawn for a terminal (Keras's progress bars: a line
redrawn with ``\\r``, coloured with ANSI codes) arrive as their last state (:func:`tidy`).

Example:
    >>> tidy(b"\\x1b[1m1/4\\x1b[0m\\r\\x1b[1m4/4\\x1b[0m loss: 0.5\\n", colour=False)
    b'4/4 loss: 0.5\\n'
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from typing import IO, Protocol

from .procs import say

#: ANSI control sequences (CSI: ``ESC [ ... final``, and two-byte escapes): colours, bold, cursor moves.
_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
#: Up to how many ranks the logs that stopped are named one by one (else ``rank-*.log``).
_LISTED = 8
#: How a failed write is said, by errno: the words after the directory's name.
_WHY = {errno.ENOSPC: "is full", errno.EDQUOT: "is over its quota"}  # else: cannot be written (why)


class Sink(Protocol):
    """Where a pump copies a worker's lines besides the terminal (a file, or a rank's :class:`RunLogs` log)."""

    def write(self, data: bytes, /) -> int:
        """Append ``data``."""

    def flush(self) -> None:
        """Make it visible."""


def tidy(line: bytes, colour: bool = True) -> bytes:
    """``line`` as a relayed, prefixed line shows it: a line redrawn with ``\\r`` as its last state, and
    without ANSI colour codes unless ``colour`` (the output is a terminal).

    Args:
        line: one line as the worker wrote it (with its newline, if any).
        colour: keep colour codes.

    Example:
        >>> tidy(b"a\\rabc\\r\\n"), tidy(b"\\x1b[32mok\\x1b[0m\\n"), tidy(b"\\x1b[32mok\\x1b[0m\\n", colour=False)
        (b'abc\\n', b'\\x1b[32mok\\x1b[0m\\n', b'ok\\n')
    """
    end = line[len(line.rstrip(b"\r\n")) :]
    body = line[: len(line) - len(end)]
    if b"\r" in body:  # the last state that shows anything (a bar ends with padding, a CRLF with nothing)
        states = [s for s in body.split(b"\r") if _ANSI.sub(b"", s).strip()]
        body = states[-1].rstrip(b" \b") if states else b""
    if not colour:
        body = _ANSI.sub(b"", body)
    return body + (b"\n" if end else b"")


def is_terminal(stream: IO[bytes]) -> bool:
    """Whether ``stream`` is a terminal (False when it cannot tell)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class RunLogs:
    """Each rank's ``rank-R.log`` in the run directory (opened on the first line): the output unprefixed.

    A failed write never ends the run: every log stops there, the terminal keeps every line, and the
    launcher says once which files stopped and why; :attr:`dropped` names them (for summary.json).

    Args:
        run_dir: the run directory, or None (no logs).
        ranks: how many ranks write (all their logs stop together).

    Example::

        logs = RunLogs("runs/train-20261207-150000", 2)
        logs.write(0, b"epoch 1\\n"); logs.close()
    """

    def __init__(self, run_dir: str | None, ranks: int) -> None:
        self.run_dir, self.ranks = run_dir, ranks
        self.files: dict[int, IO[bytes]] = {}
        #: The first failed write (None: none failed), and the logs it stopped.
        self.failure: OSError | None = None
        self.dropped: list[str] = []
        self._lock = threading.RLock()
        self._closed = False

    def write(self, rank: int, data: bytes) -> None:
        """Append ``data`` to rank ``rank``'s log and flush it; never raises."""
        if not self.run_dir or self.failure is not None or self._closed:
            return
        with self._lock:
            try:
                log = self.files.get(rank)
                if log is None:
                    log = self.files[rank] = open(os.path.join(self.run_dir, f"rank-{rank}.log"), "ab")  # noqa: SIM115
                log.write(data)
                log.flush()
            except ValueError:  # closed by close() meanwhile, while a straggler still writes
                pass
            except OSError as exc:
                self._stop(exc, rank)

    def _stop(self, exc: OSError, rank: int) -> None:
        """Close every log after a failed write and say once which stopped (the data of that write is lost)."""
        self.failure = exc
        count = max(self.ranks, rank + 1)
        self.dropped = [f"rank-{r}.log" for r in range(count)] if count <= _LISTED else ["rank-*.log"]
        self.close()
        why = _WHY.get(exc.errno or 0, f"cannot be written ({exc.strerror})")
        names = ", ".join(self.dropped) if count <= _LISTED else f"rank-0.log ... rank-{count - 1}.log"
        say(
            f"the disk of the run directory {self.run_dir} {why}: {names} {'stops' if count == 1 else 'stop'} "
            "here; the rest of the output reaches this terminal only, and the run goes on"
        )

    def close(self) -> None:
        """Close every log (flushing what it can); never raises."""
        with self._lock:
            self._closed = True  # a straggler's late line opens no new file
            for log in self.files.values():
                with contextlib.suppress(OSError, ValueError):
                    log.close()

    def log(self, rank: int) -> _RankLog:
        """Rank ``rank``'s log as a file-like ``write``/``flush`` pair for :func:`mldist.launch.groups.pump`."""
        return _RankLog(self, rank)


class _RankLog:
    """One rank's log, as the pumps write it (``flush`` is part of each write)."""

    def __init__(self, logs: RunLogs, rank: int) -> None:
        self.logs, self.rank = logs, rank

    def write(self, data: bytes) -> int:
        self.logs.write(self.rank, data)
        return len(data)

    def flush(self) -> None:
        pass
