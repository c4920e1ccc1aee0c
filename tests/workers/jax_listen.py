"""Worker (KERAS_BACKEND=jax): rank 0 prints where JAX's coordinator listens (``ss -ltn`` lines of its port)."""

from __future__ import annotations

import subprocess

import mldist

ctx = mldist.init()
port = ctx.workers[0].rpartition(":")[2]
if ctx.rank == 0:
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout.splitlines()
    for line in listening:
        local = line.split()[3]
        if local.rpartition(":")[2] == port:
            print("LISTEN", local, flush=True)
mldist.allreduce([1.0], op="sum")  # rank 0 stays until rank 1 has joined and looked
print("CHOSEN", ctx.workers[0], flush=True)
