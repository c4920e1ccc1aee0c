"""Horovod features as a Horovod user writes them, on 2 ranks: the timeline, the fusion threshold,
BestModelCheckpoint and BroadcastGlobalVariablesCallback(local_variables=...).

Usage: hvd_features.py OUT_DIR, with HOROVOD_FUSION_THRESHOLD=0; without HOROVOD_TIMELINE it
records OUT_DIR/part.json with start_timeline/stop_timeline. Prints RESULT {rank, ...}.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

import mldist.horovod as hvd_tf
import mldist.horovod.tensorflow.keras as hvd

out = sys.argv[1]
hvd.init()
r = hvd.rank()
keras = tf.keras

if not os.environ.get("HOROVOD_TIMELINE"):  # else the whole run is recorded (one profiler at a time)
    hvd.start_timeline(os.path.join(out, "part.json"))
for _ in range(3):
    hvd.allreduce(tf.ones([4]) * r)
if not os.environ.get("HOROVOD_TIMELINE"):
    hvd.stop_timeline()


@tf.function
def three(a: tf.Tensor, b: tf.Tensor, c: tf.Tensor) -> list[tf.Tensor]:
    return hvd_tf.grouped_allreduce([a, b, c])


def mpi_calls(graph: tf.Graph) -> int:
    """MPI_Allreduce calls the graph makes: one per output of each all-reduce numpy_function."""
    found, todo = 0, [graph]
    while todo:
        g = todo.pop()
        found += sum(len(op.outputs) for op in g.get_operations() if op.type == "PyFunc" and "allreduce" in op.name)
        todo += [fn.graph for fn in getattr(g, "_functions", {}).values() if hasattr(fn, "graph")]
    return found


calls = mpi_calls(three.get_concrete_function(*[tf.TensorSpec([2], tf.float32)] * 3).graph)

model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
local = model.layers[1].kernel  # each rank keeps its own output layer's kernel at the start
local.assign(tf.fill(local.shape, float(r + 5)))
model.layers[0].kernel.assign(tf.fill(model.layers[0].kernel.shape, float(r + 1)))
seen: dict[str, list[float]] = {}


class Look(keras.callbacks.Callback):  # type: ignore[misc]
    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if batch == 0 and not seen:
            seen["shared"] = model.layers[0].kernel.numpy().ravel()[:1].tolist()
            seen["local"] = local.numpy().ravel()[:1].tolist()


best = os.path.join(out, f"best-{r}.keras")
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local]),
    Look(),
    hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath=best),
]
rng = np.random.default_rng(r)
x, y = rng.random((32, 3), dtype=np.float32), rng.random((32, 1), dtype=np.float32)
model.fit(x, y, batch_size=8, epochs=2, validation_data=(x, y), verbose=0, callbacks=callbacks)
result = {"rank": r, "fused_calls": calls, "best_written": os.path.exists(best)} | seen
result["mpi_arg"] = os.environ.get("MLDIST_TEST_MPI_ARG")
print("RESULT " + json.dumps(result), flush=True)
