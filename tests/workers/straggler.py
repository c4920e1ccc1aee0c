"""Worker: Keras ``fit`` with mldist's default callbacks, where rank argv[1] sleeps argv[2] s before each batch.

argv: SLOW (the slow rank, or -1: none), SLEEP (seconds per batch), STEPS, EVERYONE (seconds every rank
sleeps per batch besides, so that a balanced run runs at the same pace). The sleep is in the main
thread, in this file (the slow-rank line must name it). Prints ``DONE rank`` at the end.
"""

from __future__ import annotations

import sys
import time

import mldist

ctx = mldist.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mldist.keras  # noqa: E402

slow, sleep, steps, everyone = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
mine = everyone + (sleep if ctx.rank == slow else 0.0)


class Pace(keras.callbacks.Callback):  # type: ignore[misc]
    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        time.sleep(mine)  # the slow rank spends its time here


model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile(mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
x, y = np.ones((8 * steps, 4), np.float32), np.ones((8 * steps, 1), np.float32)
model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[*mldist.keras.default_callbacks(), Pace()])
print("DONE", ctx.rank, flush=True)
