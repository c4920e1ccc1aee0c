"""Worker: mldist's own elastic fit (``mldist.keras.Elastic``) in a world that loses a host.

Usage: elastic_keras.py OUT [reference [EPOCHS]]  (6 epochs unless given)

A plain Keras ``fit`` over ``mldist.data.shard`` (96 samples, 8 per worker per step: 4 steps an
epoch on 3 workers, 6 on 2), SGD with momentum at ``scale_lr(0.02)``, ``Elastic(lr=0.02)``
committing every epoch. Rank 0 prints ``EPOCH e BEGIN size`` and, once after a resume, ``FIRST
STEP``. ``reference`` starts a fixed world from OUT/elastic (a copy of the commits the elastic run
resumed from, on disk); both rates must then be scale_lr's for 2 workers.
Rank 0 writes OUT/final.npy and prints ``LR rate``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import mldist
import mldist.data
import mldist.keras

ctx = mldist.init()

import elastic_common  # noqa: E402  (this directory's)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from elastic_common import X, Y  # noqa: E402

out, mode = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "elastic"
STEP_S = 0.0 if mode == "reference" else 0.4
model = elastic_common.model(keras)
optimizer = keras.optimizers.SGD(mldist.keras.scale_lr(0.02), momentum=0.9)
model.compile(mldist.keras.DistributedOptimizer(optimizer), "mse")
ds = mldist.data.shard(tf.data.Dataset.from_tensor_slices((X, Y)), 8)


class Pace(keras.callbacks.Callback):  # type: ignore[misc]
    """The epoch's line, a slow step (a host dies inside an epoch), the first step after a resume."""

    resumed = False

    def on_train_begin(self, logs: object = None) -> None:
        self.resumed = bool(os.environ.get("MLDIST_RESTART", "0") != "0")

    def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
        if ctx.rank == 0:
            print(f"EPOCH {epoch} BEGIN {ctx.size}", flush=True)

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if self.resumed and ctx.rank == 0:
            print("FIRST STEP", flush=True)
        self.resumed = False
        time.sleep(STEP_S)


# The reference: a fixed world from a copy of the elastic run's commits on disk (no memory copies).
keep = mldist.keras.Elastic(out / "elastic" if mode == "reference" else None, lr=0.02, keep=20)
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 6
model.fit(ds, epochs=epochs, verbose=0, callbacks=[*mldist.keras.default_callbacks(), keep, Pace()])
if ctx.rank == 0:
    np.save(out / "final.npy", np.concatenate([w.ravel() for w in model.get_weights()]))
    print(f"LR {float(np.asarray(optimizer.learning_rate)):g}", flush=True)
print("DONE", ctx.rank, ctx.size, flush=True)
