"""Worker: numpy-only ranks run three all-reduces; rank argv[1] then stops in a sleep, the others wait in
the fourth. Prints ``READY RANK TIME`` before the fourth; nothing prints ``UNREACHABLE``. No TensorFlow."""

from __future__ import annotations

import sys
import time

import numpy as np

import mldist

ctx = mldist.init()
for _ in range(3):
    mldist.allreduce(np.ones(4))
print("READY", ctx.rank, time.time(), flush=True)
if ctx.rank == int(sys.argv[1]):
    time.sleep(3600)  # stuck here
mldist.allreduce(np.ones(4))
print("UNREACHABLE", flush=True)
