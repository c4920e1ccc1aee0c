"""Worker: on JAX, rank 1 stops where rank 0 waits in a computation across processes that nothing marks.

argv[1]: where rank 1 stops: "nowhere" (a healthy run in which rank 1 comes 0.3 s late to each
call of the jitted function: rank 0 waits in those calls far past MLDIST_COLLECTIVE_TIMEOUT in
all, in each one briefly), "build" (before building the model, which rank 0 builds under Keras's
DataParallel: the variables' placement compares them across processes), "evaluate" (in a callback
of ``evaluate``'s third batch, where JAX's C++ fast path runs the step with no Python frame), or
"jit" (before the 4th call of a jitted function of the script's own over a global array). Rank 0
goes on; the stall watch must end the job naming rank 1 and this file's line.
"""

from __future__ import annotations

import sys
import time

import mldist

ctx = mldist.init()

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

where = sys.argv[1]


def stop(here: str) -> None:
    """Rank 1 stops for good at ``here``; rank 0 goes on."""
    if where == here and ctx.rank == 1:
        print("STUCK", time.time(), flush=True)
        time.sleep(600)  # stuck here


class Stop(keras.callbacks.Callback):  # type: ignore[misc]
    def on_test_batch_begin(self, batch: int, logs: object = None) -> None:
        if batch == 2:
            stop("evaluate")


stop("build")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(0.1), "mse")
x, y = np.ones((64, 4), np.float32), np.ones((64, 1), np.float32)
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[Stop()])
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
spread = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
data = jax.make_array_from_process_local_data(spread, np.ones(4, np.float32))
total = jax.jit(lambda a: (a * 2).sum())
for i in range(CALLS := 20):
    if i == 3:
        stop("jit")
    if where == "nowhere" and ctx.rank == 1:
        time.sleep(0.3)  # the slow rank: rank 0 waits for it in each call
    result = total(data)
print("END", ctx.rank, CALLS, float(result), flush=True)
