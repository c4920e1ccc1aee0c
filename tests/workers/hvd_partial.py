"""Local layers, as a Horovod user writes them, on 2 ranks: PartialDistributedGradientTape and
PartialDistributedOptimizer keep some gradients on each rank (divided by the size, Horovod's
default) and average the others. Prints RESULT {rank, tape, split, split_sources, fit_shared, fit_local}.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

import mldist.horovod as hvd_tf
import mldist.horovod.tensorflow.keras as hvd

hvd.init()
r = hvd.rank()
keras = tf.keras

# The tape: loss = (a + b) * x with x = rank + 1, so each gradient is x on its own rank.
shared_layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
local_layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
x = tf.constant([[float(r + 1)]])
shared_layer(x), local_layer(x)
with tf.GradientTape(persistent=True) as tape:
    loss = tf.reduce_sum(shared_layer(x) + local_layer(x))
tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=[local_layer])
grads = tape.gradient(loss, [shared_layer.kernel, local_layer.kernel])
tape_result = [float(tf.reshape(g, [-1])[0]) for g in grads]  # mean of x; this rank's x / size
# Horovod's split of the same gradients: (source, gradient) pairs, the local sources' first.
local, shared = tape.get_local_and_global_gradients(loss, [shared_layer.kernel, local_layer.kernel])
split = [[float(tf.reshape(g, [-1])[0]) for _, g in part] for part in (local, shared)]
split_sources = [v is local_layer.kernel for v, _ in local] + [v is shared_layer.kernel for v, _ in shared]

# The optimizer in fit: the last layer stays per rank, the first is averaged.
model = keras.Sequential(
    [
        keras.Input((2,)),
        keras.layers.Dense(2, kernel_initializer="ones"),
        keras.layers.Dense(1, kernel_initializer="ones"),
    ]
)
opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.01), local_layers=[model.layers[-1]])
model.compile(opt, "mse")
rng = np.random.default_rng(r)
model.fit(rng.random((16, 2)), rng.random((16, 1)) * (r + 1), batch_size=8, epochs=2, verbose=0)
result = {
    "rank": r,
    "tape": tape_result,
    "split": split,
    "split_sources": split_sources,
    "fit_shared": model.layers[0].kernel.numpy().ravel().tolist(),
    "fit_local": model.layers[1].kernel.numpy().ravel().tolist(),
}
print("RESULT " + json.dumps(result), flush=True)
