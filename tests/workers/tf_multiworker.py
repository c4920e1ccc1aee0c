"""TensorFlow's multi-worker tutorial, in the project's own words: TF-Keras under MultiWorkerMirroredStrategy.

Usage: TF_USE_LEGACY_KERAS=1 python tf_multiworker.py OUT_DIR

Reads the cluster from TF_CONFIG (``mldist run --tf-config``), builds and compiles the model
inside the strategy's scope, and fits on a dataset that the strategy shards by data. No mldist
import. Prints one RESULT line per worker and writes OUT_DIR/weights-R.npy.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras

OUT = Path(sys.argv[1])
task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
strategy = tf.distribute.MultiWorkerMirroredStrategy()
tf_keras.utils.set_random_seed(7)

global_batch = 32
rng = np.random.default_rng(0)
x = rng.random((12 * global_batch, 8, 8, 1), dtype=np.float32)
y = rng.integers(0, 10, 12 * global_batch)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = data.with_options(options)

with strategy.scope():
    model = tf_keras.Sequential(
        [
            tf_keras.Input((8, 8, 1)),
            tf_keras.layers.Conv2D(16, 3, activation="relu"),
            tf_keras.layers.Flatten(),
            tf_keras.layers.Dense(10),
        ]
    )
    model.compile(tf_keras.optimizers.SGD(0.05), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=1, verbose=0)
index = int(task.get("index", 0))
np.save(OUT / f"weights-{index}.npy", np.concatenate([w.ravel() for w in model.get_weights()]))
print("RESULT " + json.dumps({"rank": index, "replicas": strategy.num_replicas_in_sync}), flush=True)
