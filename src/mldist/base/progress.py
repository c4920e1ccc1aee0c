"""Where every rank is: the records ranks publish of their collectives and their main thread's code.

Each rank's collective watch (:mod:`mldist.runtime.watch.stall`) writes its record about once a second:
how many collectives it began and finished, the one in flight, the last one finished, and the
innermost frames of its main thread. It goes to node-local memory, and one rank per node
gathers its node's records into ``node-HOST.rec`` in the job's progress folder
(:mod:`mldist.base.nodes`): the shared file system sees one file per node. When a collective
times out, one rank reads the records to name the rank that never arrived and where it is, and
the others take its verdict (:mod:`mldist.runtime.watch.verdict`); ``mldist stacks`` and ``mldist run``
(SIGQUIT) read them for a job that is slow rather than stuck. Nothing needs the late rank's
cooperation at that moment: its record is what it last wrote, and its age says how fresh that is.

The folder (:func:`folder`): ``MLDIST_PROGRESS_DIR`` (``mldist run`` sets it), else
``progress/`` in the run directory (``MLDIST_RUN_DIR``: ``mldist submit``'s jobs keep it on
a filesystem every node sees), else a folder of this node's temporary directory named after
the job (a bare ``mpiexec`` or ``srun``: ranks of other nodes are not seen there).

Example:
    >>> import tempfile
    >>> where = Path(tempfile.mkdtemp())
    >>> write(where, Record(rank=1, host="n1", pid=7, began=3, finished=2, current=(3, "allreduce(sum)", 99.0),
    ...                     last=(2, "broadcast", 98.0), stack=("t.py:9 <module>: step()",), written=100.0))
    >>> read(where)[1].current
    (3, 'allreduce(sum)', 99.0)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import envvalues, hosts, nodes

#: The variable that names the folder; ``mldist run`` sets it for its workers.
FOLDER_ENV = envvalues.PROGRESS_DIR.name
#: How often a rank writes its record (seconds), at any size (node-local memory: :mod:`mldist.base.nodes`).
PUBLISH_SECONDS = 1.0
#: A record older than this many publishing intervals is stale: its rank's watch thread cannot run
#: (its main thread holds Python's lock in C code) or the rank is gone.
STALE_AFTER = 3
#: Variables that name a bare launcher's job, the most specific first (one mpiexec or srun step of a
#: batch job, then the job): the ranks of one launch share the folder, two launches never do.
JOB_KEYS = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PALS_APID", "SLURM_JOB_ID", "PBS_JOBID", "COBALT_JOBID")
_FILE = re.compile(r"rank-([0-9]{1,7})\.json")


@dataclass(frozen=True)
class Record:
    """What one rank published.

    Args:
        rank: the rank.
        host, pid: where it runs.
        began, finished: how many collectives it began and finished.
        current: (number, what, since) of the collective in flight, or None between collectives.
        last: (number, what, when) of the last collective it finished, or None.
        stack: its main thread's innermost frames, innermost first (``file:line function: code``).
        written: when the record was written (seconds since the epoch).
        every: how often its rank writes one (seconds; see :func:`interval`).
        waits: its last collectives as (number, seconds waited in it, seconds since its previous one ended),
            for the slow-rank account (:mod:`mldist.runtime.watch.straggler`).
    """

    rank: int
    host: str
    pid: int
    began: int
    finished: int
    current: tuple[int, str, float] | None
    last: tuple[int, str, float] | None
    stack: tuple[str, ...]
    written: float
    every: float = PUBLISH_SECONDS
    waits: tuple[tuple[int, float, float], ...] = ()

    def age(self, now: float | None = None) -> float:
        """Seconds since the record was written."""
        return max(0.0, (time.time() if now is None else now) - self.written)

    def stale(self, now: float | None = None) -> bool:
        """Whether its rank stopped writing (see :data:`STALE_AFTER`)."""
        return self.age(now) > STALE_AFTER * self.every + 1


def interval(size: int) -> float:
    """How often each of ``size`` ranks writes its record: every second at any size, since a rank writes to
    node-local memory and one rank per node to the shared folder (:mod:`mldist.base.nodes`).

    Example:
        >>> interval(2), interval(16384)
        (1.0, 1.0)
    """
    del size  # kept in the signature: callers pass it
    return PUBLISH_SECONDS


def folder(env: Mapping[str, str]) -> Path | None:
    """This job's progress folder (see the module doc), or None outside a job of several ranks.

    Example:
        >>> str(folder({"MLDIST_RUN_DIR": "/r"})), folder({})
        ('/r/progress', None)
    """
    if chosen := envvalues.PROGRESS_DIR.read(env):
        return Path(chosen)
    if run_dir := envvalues.RUN_DIR.read(env):
        return Path(run_dir) / "progress"
    name = next((name for name in JOB_KEYS if env.get(name)), None)
    if name is None:
        return None
    step = env.get("SLURM_STEP_ID", "") if name == "SLURM_JOB_ID" else ""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{env[name]}.{step}" if step else env[name])
    import tempfile  # only here: tempfile brings shutil, random and the compressors to every rank

    return Path(tempfile.gettempdir()) / f"mldist-{os.getuid()}" / f"progress-{safe}"


def temporary(env: Mapping[str, str]) -> bool:
    """Whether :func:`folder` is a node's temporary one (no launcher's, no run directory): records
    there are worth nothing after the job, and each rank removes its own at a clean exit.

    Example:
        >>> temporary({"SLURM_JOB_ID": "7"}), temporary({"MLDIST_RUN_DIR": "/r", "SLURM_JOB_ID": "7"})
        (True, False)
    """
    return not envvalues.PROGRESS_DIR.read(env) and not envvalues.RUN_DIR.read(env) and folder(env) is not None


def forget(where: Path, rank: int) -> None:
    """Remove rank ``rank``'s record from ``where`` (if there)."""
    with contextlib.suppress(OSError):
        (where / f"rank-{rank}.json").unlink()


def write(where: Path, record: Record) -> None:
    """Replace ``rank-R.json`` in ``where`` (made owner-only if missing): temp file, then rename.

    No fsync: a record is rewritten every second and worth nothing after the job.
    """
    path = where / f"rank-{record.rank}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(asdict(record)))
    except FileNotFoundError:  # the folder is made when missing, not tried before every write
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, path)


def _record(data: Any) -> Record | None:
    try:
        current, last = data["current"], data["last"]
        return Record(
            rank=int(data["rank"]),
            host=str(data["host"]),
            pid=int(data["pid"]),
            began=int(data["began"]),
            finished=int(data["finished"]),
            current=(int(current[0]), str(current[1]), float(current[2])) if current else None,
            last=(int(last[0]), str(last[1]), float(last[2])) if last else None,
            stack=tuple(str(s) for s in data["stack"]),
            written=float(data["written"]),
            every=float(data.get("every", PUBLISH_SECONDS)),
            waits=tuple((int(n), float(w), float(g)) for n, w, g in data.get("waits", ())),
        )
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def read(where: Path) -> dict[int, Record]:
    """Every rank's record in ``where`` by rank: the nodes' files (:mod:`mldist.base.nodes`), and ``rank-R.json``
    of one rank each (:func:`write`); damaged or half-written files are skipped. The newest record of a rank wins."""
    out: dict[int, Record] = {}
    node_files: list[str] = []
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            if nodes.NODE_FILE.fullmatch(entry.name):
                node_files.append(entry.name)
            elif _FILE.fullmatch(entry.name):
                with contextlib.suppress(OSError, ValueError):
                    _keep(out, _record(json.loads(Path(entry.path).read_text())))
    for data in nodes.read_nodes(where, node_files):
        _keep(out, _record(data))
    return dict(sorted(out.items()))


def has_records(where: Path) -> bool:
    """Whether ``where`` holds progress records (a node's file or a rank's), not merely other ``rank-*`` files
    (RunLog's ``rank-R.metrics.json`` sit in a run directory's top level).

    Example:
        >>> has_records(Path("/nonexistent"))
        False
    """
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        return any(nodes.NODE_FILE.fullmatch(e.name) or _FILE.fullmatch(e.name) for e in entries)
    return False


def _keep(out: dict[int, Record], record: Record | None) -> None:
    """Put ``record`` into ``out`` unless a newer one of its rank is there."""
    if record is not None and (record.rank not in out or out[record.rank].written <= record.written):
        out[record.rank] = record


def clock(seconds: float) -> str:
    """A wall-clock time as ``HH:MM:SS`` (local time).

    Example:
        >>> len(clock(0.0))
        8
    """
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def describe(record: Record, now: float | None = None) -> list[str]:
    """Lines for one rank: where it is in its collectives, then its frames (``mldist stacks``).

    Example:
        >>> r = Record(0, "n1", 7, 5, 5, None, (5, "allreduce(sum)", 0.0), ("t.py:3 f: x()",), 10.0)
        >>> describe(r, now=10.5)[0]
        'rank 0 (n1, pid 7): between collectives: finished #5 allreduce(sum) 10 s ago'
    """
    now = time.time() if now is None else now
    current, last = in_flight(record, now), finished_last(record)
    if current:
        where = f"in {current}"
    elif last:
        where = f"between collectives: finished {last[0]} {now - last[1]:.0f} s ago"
    else:
        where = "before its first collective"
    stale = f" (record {record.age(now):.0f} s old: {STALE_WHY})" if record.stale(now) else ""
    head = f"rank {record.rank} ({record.host}, pid {record.pid}): {where}{stale}"
    return [head, *(f"    {frame}" for frame in record.stack or ("(no Python frames)",))]


def gone(record: Record) -> bool:
    """Whether ``record``'s process has ended: it ran on this host and no process has its pid now.

    Of a rank on another host nothing is known here: never gone.

    Example:
        >>> gone(Record(0, hosts.hostname(), os.getpid(), 0, 0, None, None, (), 0.0))
        False
    """
    return process_gone(record.host, record.pid)


def process_gone(host: str, pid: int) -> bool:
    """Whether process ``pid`` of ``host`` has ended: it is this host, and no process has that pid now.

    Example:
        >>> process_gone(hosts.hostname(), os.getpid()), process_gone("another-host", 1)
        (False, False)
    """
    if host != hosts.hostname() or pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def describe_past(record: Record, ended: float | None = None, now: float | None = None) -> list[str]:
    """Lines for one rank of a run that is over: its last record, in the past tense (``mldist stacks``).

    Args:
        record: the rank's last record.
        ended: when the run ended (its summary.json), or None when unknown (its process is gone).
        now: the time (default: now), for a record's age when ``ended`` is unknown.

    Example:
        >>> r = Record(0, "n1", 7, 4, 3, (4, "allreduce(sum)", 2.0), None, ("t.py:3 f: x()",), 10.0)
        >>> describe_past(r, ended=15.0)[0][-75:]
        '(5 s before the run ended): it was in collective #4 allreduce(sum), for 8 s'
    """
    if record.current is not None:
        number, what, since = record.current
        where = f"it was in collective #{number} {what}, for {record.written - since:.0f} s"
    elif record.last is not None:
        number, what, when = record.last
        where = f"it was between collectives, the last finished #{number} {what} at {clock(when)}"
    else:
        where = "it had begun no collective"
    if ended is not None:
        age = f"{max(0.0, ended - record.written):.0f} s before the run ended"
    else:
        age = f"{record.age(now):.0f} s ago; its process is gone"
    who = f"rank {record.rank} ({record.host}, pid {record.pid})"
    head = f"{who}, last record at {clock(record.written)} ({age}): {where}"
    return [head, *(f"    {frame}" for frame in record.stack or ("(no Python frames)",))]


#: Why a rank has no record.
NO_RECORD = (
    "records come from mldist.init()'s collective watch, about once a second; MLDIST_COLLECTIVE_TIMEOUT=0 turns it off"
)
#: Why a record stops being rewritten while its rank lives.
STALE_WHY = "its watch cannot run, so its main thread is likely in C code that holds Python's lock (the GIL)"


def in_flight(record: Record, now: float) -> str:
    """``collective #N what for S s`` of the collective in flight ("" between collectives)."""
    if record.current is None:
        return ""
    number, what, since = record.current
    return f"collective #{number} {what} for {now - since:.0f} s"


def finished_last(record: Record) -> tuple[str, float] | None:
    """(``#N what``, when) of the last collective finished, or None."""
    if record.last is None:
        return None
    number, what, when = record.last
    return f"#{number} {what}", when
