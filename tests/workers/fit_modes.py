"""Worker for the training-engine tests. Usage: fit_modes.py MODE OUT_DIR.

Modes:
  equivalence  20 SGD steps of the example CNN, global batch 32; with N workers each
               takes its 1/N of every batch. Weights are written to OUT_DIR/weights-R.npy.
  meangrad     one SGD step (lr 1) of a linear model on data that differs per rank;
               writes the local gradient and the weights after the step.
  xla          fit with jit_compile=True (must stop with one clear line on CPU).
  uneven       rank 1 has one batch more than rank 0 (must stop, naming both counts).
  shapes       the ranks all-reduce tensors of different shapes (must stop, explained).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import mldist
import mldist.keras

MODE, OUT = sys.argv[1], Path(sys.argv[2])
ctx = mldist.init()

import keras  # noqa: E402

if ctx.backend == "tensorflow":
    import tensorflow as tf

    if MODE != "xla":  # Keras turns XLA off when op determinism is on
        tf.config.experimental.enable_op_determinism()
# Determinism needs seeded random ops. On TensorFlow the seeds differ per rank, so
# BroadcastInitialState must make the starts equal; JAX's DataParallel needs equal weights
# from the start (each process builds the replicated variables), so the seed is the same.
keras.utils.set_random_seed(1234 + (ctx.rank if ctx.backend == "tensorflow" else 0))


def cnn() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def flat_weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


if MODE == "equivalence":
    steps, global_batch = 20, 32
    rng = np.random.default_rng(0)
    x = rng.random((steps * global_batch, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, steps * global_batch)
    per = global_batch // ctx.size
    rows = np.concatenate(
        [np.arange(b * global_batch + ctx.rank * per, b * global_batch + (ctx.rank + 1) * per) for b in range(steps)]
    )
    model = cnn()
    opt = mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.05))
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(
        x[rows],
        y[rows],
        batch_size=per,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=mldist.keras.default_callbacks(),
    )
    np.save(OUT / f"weights-{ctx.rank}.npy", flat_weights(model))
elif MODE == "meangrad":
    rng = np.random.default_rng(100 + ctx.rank)  # every rank has different data
    x = rng.normal(size=(16, 3)).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    loss = keras.losses.MeanSquaredError()
    with tf.GradientTape() as tape:
        local = loss(y, model(x))
    (grad,) = tape.gradient(local, model.trainable_variables)
    np.save(OUT / f"grad-{ctx.rank}.npy", grad.numpy())
    model.compile(mldist.keras.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    np.save(OUT / f"after-{ctx.rank}.npy", model.get_weights()[0])
elif MODE == "xla":
    model = cnn()
    model.compile(
        mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    model.fit(np.zeros((8, 8, 8, 1), np.float32), np.zeros(8, np.int64), batch_size=4, verbose=0)
    print("XLA-FIT-RAN", flush=True)
elif MODE == "uneven":
    model = cnn()
    model.compile(
        mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    n = 4 * (3 + ctx.rank)  # 3 batches of 4 on rank 0, 4 on rank 1
    model.fit(
        np.zeros((n, 8, 8, 1), np.float32),
        np.zeros(n, np.int64),
        batch_size=4,
        verbose=0,
        callbacks=mldist.keras.default_callbacks(),
    )
    print("UNEVEN-FIT-RAN", flush=True)
elif MODE == "shapes":
    mldist.allreduce(tf.ones([3 + ctx.rank]))
    print("SHAPES-RAN", flush=True)
else:
    raise SystemExit(f"unknown mode {MODE}")
