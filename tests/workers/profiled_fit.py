"""Worker: a small Keras fit with mldist's default callbacks (a timeline when MLDIST_PROFILE_STEPS is set).

Keras 3 on its configured backend (KERAS_BACKEND): TensorFlow's profiler records TensorFlow, JAX's JAX.
"""

import keras
import numpy as np
import tensorflow as tf

import mldist
import mldist.keras

ctx = mldist.init()
model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
model.compile(optimizer=mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
rng = np.random.default_rng(ctx.rank)
x, y = rng.random((64, 8), np.float32), rng.random((64, 4), np.float32)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
model.fit(ds, epochs=2, verbose=0, shuffle=False, callbacks=mldist.keras.default_callbacks())
print("FIT-DONE", ctx.rank, flush=True)
