"""Worker (KERAS_BACKEND=jax): a custom loop whose step is a JAX collective mldist does not see,
marked with ``mldist.stall_watch``; rank 1 sleeps before its 4th step.
"""

from __future__ import annotations

import time

import mldist

ctx = mldist.init()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

for step in range(6):
    if ctx.rank == 1 and step == 3:
        print("STUCK", time.time(), flush=True)
        time.sleep(600)  # rank 1 sleeps here
    with mldist.stall_watch("my step"):
        jax.block_until_ready(multihost_utils.process_allgather(np.ones(4, np.float32)))
print("UNREACHABLE", flush=True)
