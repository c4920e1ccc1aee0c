"""In a job script, before its ranks start: the engine, decided once for all of them.

``mldist submit``'s script runs it on the job's first node, where the modules, the environment and
the container are the ranks' own, and exports what it prints as ``MLDIST_DECISION``
(:func:`mldist.placement.handed.for_job`). Each rank takes that decision where its facts are these,
and ``mldist env`` says so. Where it cannot decide (a bad setting) it prints why instead, in one
line, and exits 2: the script says that line and the ranks decide alone (and say it too).

Example::

    MLDIST_DECISION=$(python3 -m mldist.launch.batch.decided 8 srun)
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ...base.envparse import whole
from ...errors import MldistError
from ...placement import engines, handed


def main(argv: list[str]) -> int:
    """Print the decision for ``argv[0]`` ranks started by ``argv[1]``; why not, and 2, if there is none."""
    if len(argv) != 2 or whole(1)(argv[0]) is None:
        print("usage: python -m mldist.launch.batch.decided RANKS LAUNCHER", file=sys.stderr)
        return 2
    try:
        mpi4py = importlib.util.find_spec("mpi4py") is not None
        text = handed.for_job(os.environ, int(argv[0]), argv[1], gpu=engines.gpu_device_nodes(), mpi4py=mpi4py)
    except MldistError as exc:
        print(exc)  # the script's line says it (its stderr goes nowhere: a python3 without mldist says nothing)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
