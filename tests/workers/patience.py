"""A 2-rank check that a rank waiting for a late peer leaves its core to others.

Rank 1 reaches an all-reduce 3 s after rank 0; each rank prints ``WAITED CPU WALL``: the CPU
seconds of its process and the seconds that all-reduce took.
"""

import time

import tensorflow as tf

import mldist

ctx = mldist.init()
mldist.allreduce(tf.ones([4]), op="sum")  # both ranks are past their start-up
if ctx.rank == 1:
    time.sleep(3)
cpu, wall = time.process_time(), time.perf_counter()
mldist.allreduce(tf.ones([4]), op="sum")
print(f"WAITED {time.process_time() - cpu:.3f} {time.perf_counter() - wall:.3f}", flush=True)
