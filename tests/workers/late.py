"""Worker: some ranks are alive but never reach the collective rank 0 waits in.

argv[1:]: how each rank from 1 on is stuck, one word per rank: "sleep" (time.sleep), "busy" (a
pure-Python loop), "gil" (a C call that holds Python's lock: libc's sleep through ctypes.PyDLL),
or "desync" (it broadcasts while rank 0 all-reduces). Rank 0 trains with Keras ``fit`` and
mldist's default callbacks (on either backend); a stuck rank stops before its 4th step.
"""

from __future__ import annotations

import ctypes
import sys
import time

import mldist

ctx = mldist.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import mldist.keras  # noqa: E402

how = sys.argv[ctx.rank] if ctx.rank else "train"


def spin() -> None:
    total = 0
    while True:
        total += 1  # busy: a pure-Python loop


def stuck() -> None:
    if how == "sleep":
        time.sleep(600)  # sleeping here
    elif how == "busy":
        spin()
    elif how == "gil":
        ctypes.PyDLL(None).sleep(600)  # a C call holding the GIL
    elif how == "desync":
        mldist.broadcast(np.ones(4, np.float32))  # the others all-reduce


class Stuck(keras.callbacks.Callback):  # type: ignore[misc]
    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if batch == 3 and how != "train":
            print("STUCK", time.time(), flush=True)
            stuck()


model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
x, y = np.ones((64, 4), np.float32), np.ones((64, 1), np.float32)
model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[*mldist.keras.default_callbacks(), Stuck()])
print("UNREACHABLE", flush=True)
