"""Worker: a group that half forms: rank 0 joins (``mldist.init()``), the other ranks finish without joining.

argv[1]: ``after``: the others finish once rank 0 marked its join, and so wait in MPI's or JAX's
start-up (rank 0 imports Keras and its backend first, as a script does: after its mark only the
start-up is left); ``before``: they finish first, and rank 0 joins once their notes are there.
argv[2], if given, ``jax``: rank 0 joins through JAX's own ``jax.distributed.initialize()``, no mldist.
Each rank prints ``ALONE <rank> <time>`` as it finishes without joining; nothing prints
``UNREACHABLE`` when the job ends as it must.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mldist.base import progress  # not a join: only where the ranks leave their notes

order = sys.argv[1]
rank = int(os.environ["RANK"])  # the start-up hook sets it under every launcher
where = progress.folder(os.environ)
assert where is not None, "no progress folder: the start-up hook is not on PYTHONPATH"


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


if rank:
    if order == "after":
        wait_for(where / "group-0.joining")
        time.sleep(3)  # rank 0 goes on into MPI's or JAX's start-up, and waits there
    print("ALONE", rank, time.time(), flush=True)
    sys.exit(0)

if order == "before":
    wait_for(where / "group-1")
if sys.argv[2:] == ["jax"]:
    import jax

    jax.distributed.initialize()  # the join, JAX's own
    print("UNREACHABLE", flush=True)
    sys.exit(0)
import keras  # noqa: E402,F401  (its backend too, before the join)

import mldist  # noqa: E402

mldist.init()  # the join
print("UNREACHABLE", flush=True)
