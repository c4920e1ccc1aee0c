"""Worker: rank 1 stalls (sleeps) before an all-reduce that rank 0 is already waiting in.

argv[1]: "eager" (mldist.allreduce) or "fit" (Keras fit with DistributedOptimizer, rank 1 sleeping
in a callback before its next step). Rank 0 should be ended by the stalled-collective watch.
"""

from __future__ import annotations

import sys
import time

import mldist

ctx = mldist.init()

import tensorflow as tf  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
mldist.allreduce(tf.ones([4]))  # both ranks take part: the runtime works
print("WARM", time.time(), flush=True)
if mode == "eager":
    if ctx.rank == 1:
        time.sleep(60)
    mldist.allreduce(tf.ones([4]))
else:
    import keras

    import mldist.keras

    class Stall(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
            if ctx.rank == 1 and batch == 3:
                time.sleep(60)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse", jit_compile=False)
    x = tf.ones([64, 4])
    model.fit(x, tf.ones([64, 1]), batch_size=8, epochs=1, verbose=0, callbacks=[Stall()])
print("UNREACHABLE", flush=True)
