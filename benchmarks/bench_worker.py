"""One benchmark process: Keras fit of the example CNN on MNIST-shaped random data.

Usage: bench_worker.py {plain,mldist,mldist-tiny,allreduce} --threads T --steps S [--warmup W] [--one-core]
Prints ``RESULT {json}`` with this process's images per second over the timed steps.
``mldist-tiny`` all-reduces 4 bytes per step instead of the gradient (each rank applies its
own gradient): the fixed cost of having any collective in the step. ``allreduce`` instead
times mldist.allreduce of the CNN's gradient size and of 1,000 floats.
"""

from __future__ import annotations

import argparse
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("mode", choices=("plain", "mldist", "mldist-tiny", "allreduce"))
p.add_argument("--threads", type=int, required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--warmup", type=int, default=15)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--one-core", action="store_true", help="pin this process to CPU 0")
p.add_argument("--core", type=int, default=0, help="the CPU --one-core pins to")
args = p.parse_args()
if args.one_core:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[args.core]})

rank, size = 0, 1
if args.mode != "plain":
    import mldist
    import mldist.keras

    ctx = mldist.init()
    rank, size = ctx.rank, ctx.size

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.mode == "plain":
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)

model = keras.Sequential(
    [
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
)


class TinySync(keras.optimizers.SGD):  # type: ignore[misc]
    """SGD whose step waits for a 4-byte all-reduce: a collective's cost without the bytes."""

    def apply(self, grads: list[tf.Tensor], trainable_variables: object = None) -> object:
        s = mldist.allreduce(tf.reshape(tf.reduce_sum(grads[0]), [1]))
        return super().apply([g + 0.0 * s[0] for g in grads], trainable_variables)


opt = TinySync(0.01) if args.mode == "mldist-tiny" else keras.optimizers.SGD(0.01)
callbacks: list[keras.callbacks.Callback] = []
if args.mode == "mldist":
    opt = mldist.keras.DistributedOptimizer(opt)
    callbacks = mldist.keras.default_callbacks()
model.compile(opt, "sparse_categorical_crossentropy")


class Timer(keras.callbacks.Callback):  # type: ignore[misc]
    start = 0.0
    end = 0.0

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if batch == args.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, logs: object = None) -> None:
        self.end = time.perf_counter()


if args.mode == "allreduce":
    grad_floats = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    times = {}
    for label, n in (("gradient", grad_floats), ("tiny", 1000)):
        value = tf.ones([n])
        reduce_fn = tf.function(lambda v: mldist.allreduce([v]))
        for _ in range(args.warmup):
            reduce_fn(value)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            out = reduce_fn(value)
        out[0].numpy()
        times[label] = (time.perf_counter() - t0) / args.steps
    result = {"rank": rank, "gradient_bytes": grad_floats * 4, "allreduce_ms": times["gradient"] * 1e3}
    result["tiny_allreduce_ms"] = times["tiny"] * 1e3
    print("RESULT " + json.dumps(result), flush=True)
    raise SystemExit(0)

timer = Timer()
n = (args.warmup + args.steps) * args.batch
rng = np.random.default_rng(rank)
x = rng.random((n, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, n)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch, drop_remainder=True).cache()
model.fit(ds, epochs=1, verbose=0, callbacks=[*callbacks, timer])
ips = args.steps * args.batch / (timer.end - timer.start)
print("RESULT " + json.dumps({"rank": rank, "size": size, "images_per_second": ips}), flush=True)
