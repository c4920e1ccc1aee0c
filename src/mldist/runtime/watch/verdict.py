"""One reader when a collective times out: the ranks agree on who looks, the others take its verdict.

When one rank never reaches a collective, every other rank times out in it within a second or
two. Reading every record on each of them would cost N x N reads of the shared folder (268
million at 16,384 ranks). Instead, on each node the first waiting rank to take the node's lock
in node-local memory is the node's reader (the others there wait for the verdict it copies into
node-local memory); the node readers race to create ``stall-N.claim`` in the shared folder
(``O_EXCL``: one wins); the winner reads the records once, names the late ranks, and writes
``stall-N.rec``, which the node readers poll once a second. One stuck rank costs one reading of
the N records in all, and a metadata operation per node a second while the verdict is on its
way. A claim whose verdict does not come within :data:`ORPHANED` seconds (its claimer died) is
given up: each node reader then reads for itself.

Example::

    verdicts = Verdicts(shared, nodes.local_folder(shared), rank=3, born=time.time())
    lines = verdicts.ask(58, since=..., judge=lambda: stall_lines.late_lines(...))   # None: not yet
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...base import nodes

#: Seconds after a claim without its verdict that node readers stop waiting and read for themselves.
ORPHANED = 20.0


class Verdicts:
    """This process's side of the one-reader agreement (see the module doc).

    Args:
        shared: the shared progress folder.
        local: the node-local folder (:func:`mldist.base.nodes.local_folder`).
        rank: this rank (named in its claim).
        born: claims and verdicts older than this are an earlier attempt's (a reused run directory).
        wall: the time source (seconds since the epoch).
    """

    def __init__(
        self, shared: Path, local: Path, rank: int, born: float, wall: Callable[[], float] = time.time
    ) -> None:
        self.shared, self.local, self.rank, self.born, self.wall = shared, local, rank, born, wall
        self._reader: int | None = None  # the node reader's lock, held for good once taken
        self._claims: dict[int, dict[str, Any]] = {}  # number -> a claim seen (not to look again)
        #: How many times this process judged (read every record): the benchmark counts them.
        self.judged = 0

    def ask(self, number: int, since: float, judge: Callable[[], list[str]]) -> list[str] | None:
        """The verdict on collective ``number`` (the lines naming its late ranks; [] when none is late), or None
        while it is on its way. ``since``: when this rank's wait began (an older verdict is another wait's);
        ``judge`` reads the records and names the late ranks (run here only when this rank is the reader)."""
        local = self.local / f"verdict-{number}.rec"
        if (lines := self._valid(nodes.read_file(local), number, since)) is not None:
            return lines
        if not self._node_reader():
            return None  # another rank of this node asks for the node
        found = nodes.read_file(self.shared / f"stall-{number}.rec")
        if (lines := self._valid(found, number, since)) is not None:
            self._put(local, found)
            return lines
        now = self.wall()
        claim = self._claims.get(number) or self._claim(number, since, now, found)
        if claim["rank"] == self.rank and claim["written"] == now:  # ours: read, judge, tell
            return self._judge(number, judge, [local, self.shared / f"stall-{number}.rec"])
        if now - float(claim["written"]) > ORPHANED:  # its claimer never answered: read for this node
            return self._judge(number, judge, [local])
        self._claims[number] = claim
        return None

    def _judge(self, number: int, judge: Callable[[], list[str]], into: list[Path]) -> list[str]:
        self.judged += 1
        lines = judge()
        data = {"number": number, "lines": lines, "rank": self.rank, "written": self.wall()}
        for path in into:
            self._put(path, data)
        return lines

    def _valid(self, data: Any, number: int, since: float) -> list[str] | None:
        """The lines of verdict ``data`` when it is about this wait, else None."""
        if not isinstance(data, dict) or data.get("number") != number or not isinstance(data.get("lines"), list):
            return None
        written = data.get("written")
        if not isinstance(written, int | float) or written < max(since, self.born):
            return None
        return [str(line) for line in data["lines"]]

    def _node_reader(self) -> bool:
        """Whether this process is its node's reader (it takes the node's reader lock, once, for good)."""
        if self._reader is not None:
            return True
        try:
            self.local.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.local / "reader.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return True  # no node-local memory: each rank is its own node
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._reader = fd
        return True

    def _claim(self, number: int, since: float, now: float, verdict: Any) -> dict[str, Any]:
        """The claim on ``number``: this rank's if it made it now, else the one there."""
        path = self.shared / f"stall-{number}.claim"
        mine = {"rank": self.rank, "written": now}
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                there = nodes.read_file(path)
                if not isinstance(there, dict) or not isinstance(there.get("written"), int | float):
                    return {"rank": -1, "written": now}  # being written: its claimer is at work
                answered = isinstance(verdict, dict) and float(verdict.get("written", 0)) >= there["written"]
                if there["written"] < self.born or (answered and float(verdict["written"]) < since):
                    with contextlib.suppress(OSError):
                        path.unlink()  # an earlier wait's, answered: claim this one
                    continue
                return {"rank": int(there.get("rank", -1)), "written": float(there["written"])}
            except OSError:
                return mine  # no shared folder to agree in: read alone
            try:
                os.write(fd, nodes.encode(mine))
            finally:
                os.close(fd)
            return mine
        return {"rank": -1, "written": now}

    @staticmethod
    def _put(path: Path, data: dict[str, Any]) -> None:
        """Write a verdict whole (temp, rename; no fsync: it matters only while the job runs)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with contextlib.suppress(OSError):
            tmp.write_bytes(nodes.encode(data))
            os.replace(tmp, path)
