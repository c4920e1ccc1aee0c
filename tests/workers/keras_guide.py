"""Keras's own multi-process data parallelism, as its distribution guide teaches it; no mldist in sight.

Usage: KERAS_BACKEND=jax python keras_guide.py OUT_DIR [ORDER]

ORDER (default ``keras``): ``keras`` calls only ``keras.distribution.initialize()``;
``mldist-first`` calls ``mldist.init()`` before it, ``keras-first`` after it (a script that
mixes both must form one group either way); ``jax`` calls JAX's own ``jax.distributed.initialize()``
with no arguments instead of Keras's (still no mldist in sight).

The guide's steps: initialize the process group from the environment, list every process's
devices, put a ``DataParallel`` distribution over them, then ``fit`` on a tf.data input that
each process shards itself (its 1/N of every global batch). Prints one RESULT line per rank
(processes, global devices) and writes OUT_DIR/weights-R.npy. One process (no launcher)
trains on the whole batch: the reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(sys.argv[1])
ORDER = sys.argv[2] if len(sys.argv) > 2 else "keras"

import keras  # noqa: E402

if ORDER == "mldist-first":
    import mldist

    mldist.init()
try:
    if ORDER == "jax":
        import jax

        jax.distributed.initialize()
    else:
        keras.distribution.initialize()
except ValueError as exc:  # as the guide does: one process has no cluster to join
    print(f"Keras distribution initialization skipped or failed: {exc}", flush=True)
if ORDER == "keras-first":
    import mldist

    mldist.init()

import jax  # noqa: E402

processes, rank = jax.process_count(), jax.process_index()
devices = keras.distribution.list_devices()
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False))
keras.utils.set_random_seed(1234)  # every process builds the replicated weights: alike

import tensorflow as tf  # noqa: E402  (the guide's input pipeline)

steps, global_batch = 12, 32
rng = np.random.default_rng(0)
x = rng.random((steps * global_batch, 8, 8, 1), dtype=np.float32)
y = rng.integers(0, 10, steps * global_batch)
per = global_batch // processes
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).unbatch()
# This process's rows of every global batch (rank r takes rows r*per .. (r+1)*per of each).
data = data.enumerate().filter(lambda i, _: (i % global_batch) // per == rank).map(lambda _, xy: xy).batch(per)

model = keras.Sequential(
    [
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ]
)
model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=1, shuffle=False, verbose=0)
weights = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])
np.save(OUT / f"weights-{rank}.npy", weights)
print("RESULT " + json.dumps({"rank": rank, "processes": processes, "devices": len(devices)}), flush=True)
