"""Worker: every rank all-reduces a small tensor every 0.2 s for about argv[1] seconds (default 20), then ends.

For ``mldist stacks`` and SIGQUIT to ``mldist run``: a job that runs, publishes where it is, and
finishes normally. Prints ``PUBLISHED`` once its first collectives are done.
"""

from __future__ import annotations

import sys
import time

import mldist

ctx = mldist.init()

import tensorflow as tf  # noqa: E402


def step() -> None:
    mldist.allreduce(tf.ones([4]))
    time.sleep(0.2)  # between steps


steps = int(float(sys.argv[1] if len(sys.argv) > 1 else 20) / 0.2)  # the same number on every rank
step()
print("PUBLISHED", flush=True)
for _ in range(steps):
    step()
print("DONE", ctx.rank, flush=True)
