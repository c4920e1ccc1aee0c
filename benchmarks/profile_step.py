"""Where a training step's time goes on the MPI engine: compute, waiting for the peer, the all-reduce.

    mldist run -n 2 --communication mpi --cpu-bind cores -- python benchmarks/profile_step.py [--model cnn]

Wraps the engine's agreement check (it returns when the slowest rank arrives, so its time
is the wait for the other rank plus ~5 us) and its data ``MPI_Allreduce``, trains with
``fit`` and prints, per rank, the mean step time and the mean time per step in each part.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import mldist
import mldist.keras

p = argparse.ArgumentParser()
p.add_argument("--model", choices=("cnn", "mobilenetv2"), default="cnn")
p.add_argument("--steps", type=int, default=200)
p.add_argument("--warmup", type=int, default=20)
args = p.parse_args()
ctx = mldist.init(communication="mpi")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from models import build  # noqa: E402  (benchmarks/ is the script's directory)

from mldist.runtime import mpi_engine  # noqa: E402

spent = {"wait (agreement check)": 0.0, "data MPI_Allreduce": 0.0, "callback total": 0.0}
counting = [False]


def timed(key: str, fn: Any) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            if counting[0]:
                spent[key] += time.perf_counter() - t0

    return wrapper


class TimedComm:
    """The engine's communicator with its Allreduce timed (the agreement check is timed apart)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    def Allreduce(self, *a: Any) -> Any:
        return timed("data MPI_Allreduce", self.comm.Allreduce)(*a)


mpi_engine._agree = timed("wait (agreement check)", mpi_engine._agree)
original_call = mpi_engine._call
mpi_engine._call = lambda fn, inputs, name: original_call(timed("callback total", fn), inputs, name)

model, shape, batch = build(args.model)
model.compile(mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.01)), "sparse_categorical_crossentropy")


class Clock(keras.callbacks.Callback):  # type: ignore[misc]
    start = 0.0

    def on_train_batch_begin(self, batch_index: int, logs: object = None) -> None:
        if batch_index == args.warmup:
            counting[0], self.start = True, time.perf_counter()

    def on_train_end(self, logs: object = None) -> None:
        counting[0] = False
        self.seconds = time.perf_counter() - self.start


rng = np.random.default_rng(ctx.rank)
data = tf.data.Dataset.from_tensors((rng.random((batch, *shape), dtype=np.float32), rng.integers(0, 10, batch)))
clock = Clock()
mpi_engine._comm = TimedComm(mpi_engine._comm)
model.fit(data.repeat(args.warmup + args.steps), verbose=0, callbacks=[*mldist.keras.default_callbacks(), clock])
ms = {k: round(v / args.steps * 1e3, 3) for k, v in spent.items()}
print("RESULT " + json.dumps({"rank": ctx.rank, "step_ms": round(clock.seconds / args.steps * 1e3, 3)} | ms))
