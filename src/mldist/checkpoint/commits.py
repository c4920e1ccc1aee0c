"""Elastic commits kept in memory on every host: files in ``/dev/shm`` that outlive the workers.

An elastic world re-forms by starting its workers again (:mod:`mldist.launch.elastic`), so a
commit must outlive the processes that made it, not the host. At each commit the first
worker of every host writes the state to ``/dev/shm/mldist-<uid>/<run id>/<host>-<n>.pkl``
(memory, not disk; owner-only; written to a temporary name, then renamed), numbered by a
sequence that grows with every commit; rank 0 keeps its disk copy in the run directory as
before. After a re-forming each worker names the newest sequence it can read (its host's
copy; rank 0 also the disk copy), and the lowest rank that holds the newest one loads it for
everybody. A host that is lost takes only its own copy with it; the disk copy is the last resort.

``MLDIST_ELASTIC_ID`` (set by ``mldist run`` for an elastic run) names the run; without it
there is no memory copy (a fixed world restarts from the disk copy).

Example:
    >>> import tempfile; from pathlib import Path
    >>> where = host_copy({"MLDIST_ELASTIC_ID": "a1", "MLDIST_COMMITS_DIR": tempfile.mkdtemp()}, 1, "hx1")
    >>> write(where, 3, {"epoch": 2}); read(where)
    (3, {'epoch': 2})
    >>> newest([(-1, None), (3, "hx1"), (3, "disk"), (2, "hx3")])
    1
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base import envvalues, rejoin
from ..base.files import atomic_write, make_dirs
from ..errors import CheckpointError

#: The elastic run's id, and a folder for the copies other than /dev/shm (:mod:`mldist.base.rejoin`).
RUN_ENV, DIR_ENV = rejoin.RUN_ENV, rejoin.DIR_ENV


def host_name(env: Mapping[str, str]) -> str:
    """This host's name for its copy: Slurm's node name (emulated nodes share one host name), else the host's.

    Example:
        >>> host_name({"SLURMD_NODENAME": "node3"})
        'node3'
    """
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def folder(env: Mapping[str, str]) -> Path | None:
    """Where this run's copies live on this host, or None outside an elastic run."""
    run = envvalues.ELASTIC_ID.read(env) or ""
    if not run or not run.isalnum():
        return None
    return Path(rejoin.commits_base(env)) / f"mldist-{os.getuid()}" / run


def host_copy(env: Mapping[str, str], number: int, host: str | None = None) -> Path | None:
    """The copy of the ``number``-th ``elastic.run``'s commits on this host (None outside an elastic run)."""
    where = folder(env)
    return None if where is None else where / f"{host or host_name(env)}-{number}.pkl"


def own_folder(path: Path) -> None:
    """Make ``path`` (a run's folder of copies) owner-only, under a ``mldist-<uid>`` folder of this user's.

    Raises CheckpointError when ``mldist-<uid>`` exists but is not this user's own folder (``/dev/shm``
    is shared by every user of the host).
    """
    mine = path.parent
    make_dirs(path, 0o700)
    st = os.lstat(mine)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise CheckpointError(f"{mine} is not a folder of this user's: remove it, or set {DIR_ENV} to another folder")
    os.chmod(mine, 0o700)
    os.chmod(path, 0o700)


def write(path: Path, seq: int, state: Any) -> None:
    """Keep ``state`` as commit ``seq`` at ``path``: owner-only folders and file, renamed into place."""
    own_folder(path.parent)
    atomic_write(path, pickle.dumps({"seq": seq, "state": state}), mode=0o600, dir_mode=0o700)


def read(path: Path | None) -> tuple[int, Any] | None:
    """(sequence, state) of a copy, or None when there is none or it cannot be read whole."""
    if path is None:
        return None
    try:
        held = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
        return None
    if isinstance(held, dict) and "seq" in held and "state" in held:
        return int(held["seq"]), held["state"]
    return 0, held  # a disk copy written before commits were numbered


def newest(seen: Sequence[tuple[int, Any]]) -> int | None:
    """The lowest rank holding the newest commit, from every rank's (sequence, where); None if none holds one."""
    best = max((seq for seq, _ in seen), default=-1)
    if best < 0:
        return None
    return next(rank for rank, (seq, _) in enumerate(seen) if seq == best)


def remove(path: Path | None) -> None:
    """Remove a host's copy once its run is done, and the run's folder once it is empty."""
    if path is None:
        return
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # other copies (hosts sharing /dev/shm, later elastic.run calls) remain
        path.parent.rmdir()
