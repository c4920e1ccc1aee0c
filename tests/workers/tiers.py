"""Worker for the hierarchical all-reduce (issue 65): prints RESULT json.

Keras ``fit`` of a small model with ``DistributedOptimizer`` (small buckets: several collectives a
step, overlapping backprop) for a fixed number of steps from the same seed, each rank on its own
data; then the final weights, the sums of an all-reduce of each dtype and op (float32, bfloat16,
int32; sum and max), and what the engine decided: whether its all-reduces went in tiers, over how
many nodes of how many ranks. Run it with ``MLDIST_HIERARCHICAL`` 0 and 1 and compare.
"""

from __future__ import annotations

import json
import os

import numpy as np

import mldist
import mldist.keras

ctx = mldist.init()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from mldist.runtime.engines import mpi_tiers  # noqa: E402
from mldist.runtime.engines.mpi_world import World  # noqa: E402

r, n = ctx.rank, ctx.size
keras.utils.set_random_seed(11)  # the same initial weights on every rank; the data differs
model = keras.Sequential(
    [keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(32), keras.layers.Dense(4)]
)
rng = np.random.default_rng(100 + r)
x = rng.random((64, 16), dtype=np.float32)
y = rng.integers(0, 4, 64)
opt = mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05), bucket_bytes=2048)
model.compile(opt, "sparse_categorical_crossentropy", jit_compile=False)
model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
weights = [w.tolist() for w in model.get_weights()]

tiered = mpi_tiers.tiered()  # the world's collective, no rank joined: what the fit's all-reduces took
sums = {
    "float32": mldist.allreduce(tf.fill([3000], float(r + 1)), op="sum")[0].numpy().item(),
    "bfloat16": float(mldist.allreduce(tf.fill([3000], tf.cast(r + 1, tf.bfloat16)), op="sum")[-1]),
    "int32": int(mldist.allreduce(tf.fill([5], r + 1), op="sum")[0]),
    "max": float(mldist.allreduce(tf.fill([70000], float(r)), op="max")[123]),
}
h = World.hierarchy
row = {
    "rank": r,
    "size": n,
    "node": os.uname().nodename,
    "tiered": tiered,
    "rails": World.rails is not None,  # every node alike: R all-reduces across nodes (mpi_tiers.in_rails)
    "hierarchy": None if h is None else {"on": h.on, "nodes": h.nodes, "per_node": h.per_node, "reason": h.reason},
    "weights": weights,
    "sums": sums,
}
print("RESULT " + json.dumps(row), flush=True)
