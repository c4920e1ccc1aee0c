"""Horovod's elastic Keras pattern on 2 ranks: commit after every epoch, resume after a kill -9.

Usage: hvd_elastic.py MODE, MODE "kill" (rank 1 kills itself with SIGKILL before epoch 3 of
the first attempt; run under mldist run --max-restarts 1) or "whole". SGD with momentum, so
the optimizer's slots must come back too. Prints RESULT {rank, weights, resets, restart}.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

import mldist.horovod.tensorflow.keras as hvd

hvd.init()
keras = tf.keras
mode, r = sys.argv[1], hvd.rank()
model = keras.Sequential(
    [keras.Input((3,)), keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(1))]
)
model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "mse")
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets: list[int] = []
state.register_reset_callbacks([lambda: resets.append(state.epoch)])
rng = np.random.default_rng(r)
x, y = rng.random((32, 3)), rng.random((32, 1))


@hvd.elastic.run
def train(state: hvd.elastic.KerasState) -> None:
    for epoch in range(state.epoch, 4):
        if mode == "kill" and epoch == 2 and r == 1 and os.environ.get("MLDIST_RESTART", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        state.model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        state.epoch = epoch + 1
        state.commit()


train(state)
result = {"rank": r, "weights": [w.tolist() for w in model.get_weights()], "resets": resets}
result["restart"] = os.environ.get("MLDIST_RESTART")
print("RESULT " + json.dumps(result), flush=True)

if mode == "whole":  # Horovod's elastic Keras example: the state callbacks in fit
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
    ]

    @hvd.elastic.run
    def fit(state: hvd.elastic.KerasState) -> None:
        state.model.fit(x, y, batch_size=8, epochs=3 - state.epoch, verbose=0, shuffle=False, callbacks=callbacks)

    fit(state)
    print("CALLBACKS " + json.dumps({"rank": r, "epoch": state.epoch, "batch": state.batch}), flush=True)
