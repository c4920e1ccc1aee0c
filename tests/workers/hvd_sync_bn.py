"""SyncBatchNormalization on 2 ranks, each fitting half of every batch, against one process with
BatchNormalization on the whole batch (argument "local": plain BatchNormalization on
2 ranks, the control): prints RESULT {rank, size, weights} after 5 SGD steps.

Written as a Horovod user would (only the import names mldist); the Keras is tf.keras's
(tf_keras under TF_USE_LEGACY_KERAS=1).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tensorflow as tf

import mldist.horovod.tensorflow.keras as hvd

hvd.init()
keras = tf.keras
rng = np.random.default_rng(7)
x = (rng.normal(size=(16, 5)) * [1.0, 2.0, 3.0, 4.0, 5.0] + 3.0).astype("float32")
y = rng.normal(size=(16, 1)).astype("float32")
n, r = hvd.size(), hvd.rank()
local = sys.argv[1:] == ["local"]  # the control: per-rank statistics
sync = n > 1 and not local
norm = hvd.SyncBatchNormalization(momentum=0.5) if sync else keras.layers.BatchNormalization(momentum=0.5)
model = keras.Sequential(
    [
        keras.Input((5,)),
        keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
        norm,
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=2)),
    ]
)
opt = keras.optimizers.SGD(0.1)
model.compile(hvd.DistributedOptimizer(opt) if n > 1 else opt, "mse")
half = len(x) // n
mine = slice(r * half, (r + 1) * half)
model.fit(x[mine], y[mine], batch_size=half, epochs=5, shuffle=False, verbose=0)
weights = [w.tolist() for w in model.get_weights()]  # with the moving mean and variance
print("RESULT " + json.dumps({"rank": r, "size": n, "weights": weights, "layer": type(norm).__name__}), flush=True)
