"""Worker: a custom training loop with CheckpointManager and mldist.preempt. Usage: custom_loop.py OUT [SIGNAL_AT].

A linear model trained for 30 SGD steps on data derived from (step, rank),
checkpoint every 5 steps into OUT/ckpt. With SIGNAL_AT, rank 1 alone sends
itself SIGUSR1 before that step on a fresh start: both ranks must agree, save
and exit 75. Prints "rank R starts at step S" and writes OUT/final-rank{R}.npy.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

import mldist
import mldist.preempt

out = Path(sys.argv[1])
signal_at = int(sys.argv[2]) if len(sys.argv) > 2 else -1
ctx = mldist.init()

import tensorflow as tf  # noqa: E402

w = tf.Variable(tf.zeros([4, 1]))
b = tf.Variable(tf.zeros([1]))
step_var = tf.Variable(0, dtype=tf.int64)  # any variable can ride along
mgr = mldist.CheckpointManager(out / "ckpt", keep=2)
start = mgr.restore(params=[w, b], counter=step_var)
print(f"rank {ctx.rank} starts at step {start}", flush=True)
assert int(step_var.numpy()) == start

with mldist.preempt.watch():
    for step in range(start + 1, 31):
        if step == signal_at and start == 0 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        rng = np.random.default_rng(step * 10 + ctx.rank)
        x = tf.constant(rng.normal(size=(8, 4)), tf.float32)
        y = tf.reduce_sum(x, axis=1, keepdims=True)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w + b - y) ** 2)
        tape = mldist.DistributedGradientTape(tape)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.05 * gw)
        b.assign_sub(0.05 * gb)
        step_var.assign(step)
        if step % 5 == 0:
            mgr.save(step, params=[w, b], counter=step_var)
        if mldist.preempt.agreed():
            mgr.save(step, params=[w, b], counter=step_var)
            mldist.allreduce(tf.zeros([]))  # wait until rank 0 has written
            print(f"rank {ctx.rank} saved at step {step}; exiting 75", flush=True)
            raise SystemExit(mldist.preempt.REQUEUE_CODE)

np.save(out / f"final-rank{ctx.rank}.npy", np.concatenate([w.numpy().ravel(), b.numpy()]))
