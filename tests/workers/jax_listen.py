"""Worker (KERAS_BACKEND=jax): rank 0 prints where JAX's coordinator listens (``ss -ltn`` lines of its port).

Usage: jax_listen.py [keras]: ``keras`` forms the group with ``keras.distribution.initialize()``
alone (from the variables mldist gives each worker), else with ``mldist.init()``.
"""

from __future__ import annotations

import os
import subprocess
import sys

if sys.argv[1:] == ["keras"]:
    import keras
    from jax.experimental import multihost_utils

    keras.distribution.initialize()
    rank, coordinator = int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"]), os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"]
    coordinator = coordinator.split(",")[0]

    def together() -> None:
        multihost_utils.sync_global_devices("looked")
else:
    import mldist

    ctx = mldist.init()
    rank, coordinator = ctx.rank, ctx.workers[0]

    def together() -> None:
        mldist.allreduce([1.0], op="sum")


port = coordinator.rpartition(":")[2]
if rank == 0:
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout.splitlines()
    for line in listening:
        local = line.split()[3]
        if local.rpartition(":")[2] == port:
            print("LISTEN", local, flush=True)
together()  # rank 0 stays until rank 1 has joined and looked
print("CHOSEN", coordinator, flush=True)
