"""Worker: mldist.init() (twice: idempotent) and one reduction through mldist.strategy(); prints RESULT json.

The row: placement (rank, size, local rank and size, chief, launcher), the strategy's sum of
10 ** rank over the ranks, the strategy's class, the engine, TensorFlow's intra-op threads and the
OMP_NUM_THREADS and no_proxy the worker got.
"""

import json
import os

import mldist

ctx = mldist.init()
assert mldist.init() is ctx  # idempotent

import tensorflow as tf  # noqa: E402

s = mldist.strategy()


@tf.function
def total() -> tf.Tensor:
    v = tf.constant(float(10**ctx.rank))
    return s.reduce("SUM", s.run(lambda: v), axis=None)


row = {
    "rank": ctx.rank,
    "size": ctx.size,
    "local_rank": ctx.local_rank,
    "local_size": ctx.local_size,
    "chief": ctx.is_chief,
    "launcher": ctx.launcher,
    "sum": float(total()),
    "strategy": type(s).__name__,
    "comm": ctx.communication,
    "intra": tf.config.threading.get_intra_op_parallelism_threads(),
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "no_proxy": os.environ.get("no_proxy", ""),
}
print("RESULT", json.dumps(row), flush=True)
