"""Worker for the hierarchical all-reduce's rails (issue 65) on one host: prints RESULT json.

Four ranks split by hand into two "nodes" of two (ranks 0-1 and 2-3) and two rails (the even and the
odd ranks), so :func:`mldist.runtime.engines.mpi_tiers.in_rails` runs its three steps without test
hosts: for buffers of 0 to 350,001 elements (fewer than the node's ranks, odd counts), float32 sum
in place and max from a separate input, and bfloat16 sent as its 16 bits with mldist's own sum.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
from mpi4py import MPI

from mldist.runtime.engines import mpi_join, mpi_tiers, mpi_wait

world = MPI.COMM_WORLD
r = world.Get_rank()
node, rails = world.Split(r // 2, r), world.Split(r % 2, r)
got: dict[str, list[float]] = {}
for n in (0, 1, 3, 1000, 350_001):
    ramp = np.arange(n, dtype=np.float32)
    out = ramp * (r + 1)
    mpi_tiers.in_rails(node, rails, MPI.IN_PLACE, out, MPI.SUM, mpi_wait.drive)  # sum of 1..4: 10 x ramp
    most = np.empty(n, np.float32)
    mpi_tiers.in_rails(node, rails, ramp * (r + 1), most, MPI.MAX, mpi_wait.drive)  # 4 x ramp
    bits = np.full(n, r + 1, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    mpi_tiers.in_rails(node, rails, MPI.IN_PLACE, bits, mpi_join.operations()["sum_bfloat16"], mpi_wait.drive)
    half = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    got[str(n)] = [
        float(np.abs(out - 10 * ramp).max(initial=0)),
        float(np.abs(most - 4 * ramp).max(initial=0)),
        float(np.abs(half - 10).max(initial=0)),
    ]
print("RESULT " + json.dumps({"rank": r, "errors": got}), flush=True)
