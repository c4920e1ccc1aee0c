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

from collections.abc import Mapping
from pathlib import Path

#: The elastic run's id (set by ``mldist run --min-np`` / ``--host-discovery-script`` for its workers).
RUN_ENV = "MLDIST_ELASTIC_ID"
#: The line rank 0 prints once it resumed in a re-formed world: the launcher times the re-forming by it.
RESUMED = "mldist: elastic: resumed"


def flag(env: Mapping[str, str], round_: int | None = None) -> Path | None:
    """The flag file of this round (``MLDIST_RESTART``, or ``round_``), or None outside an elastic run."""
    run_dir = env.get("MLDIST_RUN_DIR")
    if not run_dir or not env.get(RUN_ENV):
        return None
    number = round_ if round_ is not None else int(env.get("MLDIST_RESTART", "0") or 0)
    return Path(run_dir) / "elastic" / f"hosts-updated-{number}"


def raised(env: Mapping[str, str]) -> bool:
    """Whether the launcher asked this round's workers to leave at their next commit."""
    path = flag(env)
    return path is not None and path.exists()
