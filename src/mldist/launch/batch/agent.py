"""The entry point of an elastic Slurm job's agent, as the batch scripts run it.

The agent itself runs inside the job, in the one elastic supervisor: :mod:`mldist.launch.elastic.slurm`.

Example::

    python3 -m mldist.launch.batch.agent --min-nodes 2 --tasks-per-node 1 -- \\
        srun --kill-on-bad-exit=1 --nodes=3 --ntasks=3 python train.py
"""

from __future__ import annotations

import os
import sys

from ..elastic.slurm import PROBE_TIMEOUT, main, run

__all__ = ["PROBE_TIMEOUT", "main", "run"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
