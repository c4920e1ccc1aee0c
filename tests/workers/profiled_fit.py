"""Worker: a small Keras fit with mldist's default callbacks (a timeline when MLDIST_PROFILE_STEPS is set)."""

import numpy as np
import tensorflow as tf

import mldist
import mldist.keras

ctx = mldist.init()
model = tf.keras.Sequential(
    [tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(4)]
)
model.compile(optimizer=mldist.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss="mse")
rng = np.random.default_rng(ctx.rank)
x, y = rng.random((64, 8), np.float32), rng.random((64, 4), np.float32)
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0,
          callbacks=mldist.keras.default_callbacks())  # fmt: skip
print("FIT-DONE", ctx.rank, flush=True)
