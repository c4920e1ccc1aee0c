"""Worker: an elastic Horovod Keras MNIST script on mldist.horovod. Usage: hvd_elastic_mnist.py [--kill-at E].

Written like Horovod's elastic TF2 Keras MNIST example: a ``KerasState`` with batch and epoch,
a reset callback that scales the learning rate, the commit / batch / epoch state callbacks,
and ``@hvd.elastic.run`` around ``fit`` for the epochs still to go. Offline: scikit-learn's
digits. With ``--kill-at E`` rank 1 kills itself (SIGKILL) at the start of epoch E of the
first attempt; under ``mldist run --max-restarts 1`` the group resumes from the last commit.
Every rank prints ``RESULT {rank, epoch, resets, accuracy, checksum}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal

import numpy as np
import tensorflow as tf

import mldist.horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--kill-at", type=int, default=-1)
args = parser.parse_args()
hvd.init()
keras = tf.keras
# One seed: the accuracy the test checks does not depend on a lucky start (4 short epochs).
keras.utils.set_random_seed(1234)

from sklearn.datasets import load_digits  # noqa: E402  (shipped with scikit-learn: nothing is downloaded)

digits = load_digits()
x = (digits.images[..., np.newaxis] / 16.0).astype(np.float32)[hvd.rank() :: hvd.size()]
y = digits.target.astype(np.int64)[hvd.rank() :: hvd.size()]
model = keras.Sequential(
    [
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ]
)
lr = 0.05
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(lr * hvd.size()))
model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets: list[int] = []


def on_state_reset() -> None:
    """As Horovod's example: the learning rate follows the (possibly new) world size."""
    state.model.optimizer.learning_rate = lr * hvd.size()  # Keras 3 has no backend.set_value for it
    resets.append(state.epoch)


class KillAt(keras.callbacks.Callback):  # type: ignore[misc]
    def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
        first_attempt = os.environ.get("MLDIST_RESTART", "0") == "0"
        if first_attempt and hvd.rank() == 1 and state.epoch == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


state.register_reset_callbacks([on_state_reset])
callbacks = [
    KillAt(),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.UpdateEpochStateCallback(state),
]


@hvd.elastic.run
def train(state: hvd.elastic.KerasState) -> None:
    state.model.fit(x, y, batch_size=32, epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=0)


train(state)
accuracy = float(model.evaluate(x, y, verbose=0)[1])
checksum = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
result = {"rank": hvd.rank(), "epoch": state.epoch, "resets": resets, "accuracy": accuracy, "checksum": checksum}
print("RESULT " + json.dumps(result), flush=True)
