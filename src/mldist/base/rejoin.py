"""Hosts that join an elastic world: the launcher raises a flag, the workers leave at their next commit.

``mldist run --host-discovery-script`` (:mod:`mldist.launch.elastic`) writes
``<run dir>/elastic/hosts-updated-<round>`` when the script lists a host that answers and the
world may grow. At its next commit rank 0 sees the file, every rank learns it in the commit's
collective, and they exit with :data:`mldist.errors.REFORM_CODE`; the launcher starts the
next round with the new hosts, and the workers resume from that commit. Both sides name the
file from the run directory and the round (``MLDIST_RESTART``), so it needs no variable of
its own; the workers must see the launcher's run directory (a shared file system).

Example:
    >>> str(flag({"MLDIST_RUN_DIR": "/runs/a", "MLDIST_RESTART": "2", "MLDIST_ELASTIC_ID": "e1"}))
    '/runs/a/elastic/hosts-updated-2'
    >>> flag({"MLDIST_RUN_DIR": "/runs/a"}) is None  # not an elastic run
    True
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path

from . import envvalues

#: The elastic run's id (set by ``mldist run --min-np`` / ``--host-discovery-script`` for its workers).
RUN_ENV = envvalues.ELASTIC_ID.name
#: A folder for the workers' in-memory commits other than /dev/shm (tests; a site whose /dev/shm is small).
DIR_ENV = envvalues.COMMITS_DIR.name
#: Where a host keeps the commits of elastic runs: ``<base>/mldist-<uid>/<run id>/`` (mldist.checkpoint.commits).
SHM = "/dev/shm"


def commits_base(env: Mapping[str, str]) -> str:
    """The folder holding each user's ``mldist-<uid>`` folder of commits on this host.

    Example:
        >>> commits_base({"MLDIST_COMMITS_DIR": "/scratch/c"})
        '/scratch/c'
    """
    return envvalues.COMMITS_DIR.read(env) or (SHM if os.path.isdir(SHM) else tempfile.gettempdir())


def forget_command(env: Mapping[str, str], run_id: str) -> str:
    """A shell command that removes an elastic run's commits on the host it runs on (after a failed run;
    the workers remove theirs after a whole one).

    Example:
        >>> forget_command({"MLDIST_COMMITS_DIR": "/c"}, "e1f2")
        'rm -rf -- /c/mldist-"$(id -u)"/e1f2'
    """
    if not run_id.isalnum():
        raise ValueError(f"elastic run id {run_id!r} is not alphanumeric")
    return f'rm -rf -- {shlex.quote(commits_base(env))}/mldist-"$(id -u)"/{run_id}'


#: The line rank 0 prints once it resumed in a re-formed world: the launcher times the re-forming by it.
RESUMED = "mldist: elastic: resumed"


def flag(env: Mapping[str, str], round_: int | None = None) -> Path | None:
    """The flag file of this round (``MLDIST_RESTART``, or ``round_``), or None outside an elastic run."""
    run_dir = envvalues.RUN_DIR.read(env)
    if not run_dir or not envvalues.ELASTIC_ID.read(env):
        return None
    number = round_ if round_ is not None else envvalues.RESTART.read(env)
    return Path(run_dir) / "elastic" / f"hosts-updated-{number}"


def raised(env: Mapping[str, str]) -> bool:
    """Whether the launcher asked this round's workers to leave at their next commit."""
    path = flag(env)
    return path is not None and path.exists()
