"""Worker: Horovod's elastic Keras loop in a world that loses a host and takes it back (tests/launch/test_hosts.py).

Usage: elastic_fit.py OUT [reference STATE [UNTIL]]  (or OUT elastic - EPOCHS: a shorter elastic run)

Each rank fits a small model (SGD with momentum: its slots must come back too) on its shard
(rank::size) of one fixed dataset, an epoch per ``fit``, a commit after each. Rank 0 prints
``EPOCH e BEGIN size``, ``COMMIT seq epoch checksum`` and, once after a resume, ``FIRST STEP``.
After each re-forming the reset callback writes the restored state to OUT/resumed-<round>.pkl
(rank 0). ``reference STATE`` starts from such a state in a fixed world and trains alike, without
the pause, up to epoch UNTIL (default: the last): a re-formed world must go where such a world
goes. Rank 0 writes OUT/final.npy at the end, every rank OUT/final-<rank>.npy. (Arguments, not
variables: mldist run -H passes only its own families of variables to other hosts.)
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import elastic_common  # this directory's
import numpy as np
import tensorflow as tf
from elastic_common import X, Y

import mldist.horovod.tensorflow.keras as hvd

hvd.init()
keras = tf.keras
out, mode = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "elastic"
EPOCHS = int(sys.argv[4]) if len(sys.argv) > 4 else 6
STEP_S = 0.0 if mode == "reference" else 0.4
model = elastic_common.model(keras)
model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "mse")
state = hvd.elastic.KerasState(model, epoch=0)
first_step = [False]


def checksum() -> float:
    return float(sum(np.abs(w).sum() for w in model.get_weights()))


def on_reset() -> None:
    first_step[0] = True
    if hvd.rank() == 0:
        (out / f"resumed-{os.environ['MLDIST_RESTART']}.pkl").write_bytes(pickle.dumps(state.snapshot()))


class Pace(keras.callbacks.Callback):  # type: ignore[misc]
    """A slow step, so that a host dies inside an epoch; the first step after a resume, said once."""

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if first_step[0] and hvd.rank() == 0:
            print("FIRST STEP", flush=True)
        first_step[0] = False
        time.sleep(STEP_S)


def epochs(state: hvd.elastic.KerasState, commit: bool) -> None:
    for epoch in range(state.epoch, EPOCHS):
        if hvd.rank() == 0:
            print(f"EPOCH {epoch} BEGIN {hvd.size()}", flush=True)
        x, y = X[hvd.rank() :: hvd.size()], Y[hvd.rank() :: hvd.size()]
        state.model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[Pace()])
        state.epoch = epoch + 1
        if commit:
            state.commit()
            if hvd.rank() == 0:
                print(f"COMMIT {state._seq} {state.epoch} {checksum():.8f}", flush=True)


state.register_reset_callbacks([on_reset])
if mode == "reference":
    state.load(pickle.loads(Path(sys.argv[3]).read_bytes()))
    epochs(state, commit=False)
else:
    hvd.elastic.run(lambda s: epochs(s, commit=True))(state)
final = np.concatenate([w.ravel() for w in model.get_weights()])
np.save(out / f"final-{hvd.rank()}.npy", final)
if hvd.rank() == 0:
    np.save(out / "final.npy", final)
print("DONE", hvd.rank(), hvd.size(), flush=True)
