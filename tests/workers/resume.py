"""Worker for the checkpoint/resume tests. Usage: resume.py OUT_DIR [options].

Trains a small MLP (with dropout and Adam, so RNG and optimizer state matter)
on fixed synthetic data through mldist.data.shard and mldist.keras.Checkpoint
(directory OUT_DIR/ckpt). Each rank appends one JSON line per epoch begun to
OUT_DIR/epochs-rank{R}.jsonl ({"attempt", "epoch", "step"}) and, when fit
returns, writes its flattened weights to OUT_DIR/weights-rank{R}.npy.

The attempt number is MLDIST_RESTART (mldist run --max-restarts) plus
MLDIST_ATTEMPT (batch scripts' requeues).

Options:
  --epochs N         epochs in total (default 5)
  --sleep S          seconds to sleep after each batch (to be interruptible)
  --sleep-attempts A only sleep in attempts < A (default: always)
  --kill-at STEP     on attempt 0, rank --kill-rank SIGKILLs itself before global step STEP
  --save-freq F      "epoch" or a number of steps
  --check-every K    steps between preemption checks
  --private-ckpt     ranks other than 0 use an empty directory of their own (no shared file system)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import mldist
import mldist.data
import mldist.keras

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--sleep-attempts", type=int, default=1 << 30)
p.add_argument("--kill-at", type=int, default=-1)
p.add_argument("--kill-rank", type=int, default=1)
p.add_argument("--save-freq", default="epoch")
p.add_argument("--check-every", type=int, default=10)
p.add_argument("--private-ckpt", action="store_true")
args = p.parse_args()

ctx = mldist.init()
print(f"rank {ctx.rank} engine {ctx.communication}", flush=True)
attempt = int(os.environ.get("MLDIST_RESTART", "0")) + int(os.environ.get("MLDIST_ATTEMPT", "0"))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402  (the input pipeline is tf.data on both backends)

if ctx.backend == "tensorflow":
    tf.config.experimental.enable_op_determinism()
# On TensorFlow BroadcastInitialState makes different starts equal; JAX's DataParallel needs
# equal starts (each process builds the replicated variables).
keras.utils.set_random_seed(7 + (ctx.rank if ctx.backend == "tensorflow" else 0))

rng = np.random.default_rng(0)
centers = rng.normal(size=(4, 8)).astype("float32") * 2
labels = rng.integers(0, 4, 640)
x = centers[labels] + rng.normal(size=(640, 8)).astype("float32")
train = mldist.data.shard(tf.data.Dataset.from_tensor_slices((x[:512], labels[:512])), 16, shuffle_buffer=512, seed=3)
val = mldist.data.shard(tf.data.Dataset.from_tensor_slices((x[512:], labels[512:])), 16)

model = keras.Sequential(
    [
        keras.Input((8,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(4),
    ]
)
model.compile(
    optimizer=mldist.keras.DistributedOptimizer(keras.optimizers.Adam(0.01)),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
log = (args.out / f"epochs-rank{ctx.rank}.jsonl").open("a")


class Record(keras.callbacks.Callback):  # type: ignore[misc]
    step = 0

    def on_train_begin(self, logs: object = None) -> None:
        self.step = checkpoint.restored_step

    def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
        log.write(json.dumps({"attempt": attempt, "epoch": epoch, "step": self.step}) + "\n")
        log.flush()
        print(f"attempt {attempt} rank {ctx.rank}: epoch {epoch} begins at step {self.step}", flush=True)

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if attempt == 0 and ctx.rank == args.kill_rank and self.step == args.kill_at:
            print(f"rank {ctx.rank}: SIGKILL myself before step {self.step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.step += 1
        print(f"attempt {attempt} rank {ctx.rank}: step {self.step} done", flush=True)
        if args.sleep and attempt < args.sleep_attempts:
            time.sleep(args.sleep)


record = Record()
save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
checkpoint = mldist.keras.Checkpoint(args.out / "ckpt", save_freq=save_freq, keep=3, check_every=args.check_every)
model.fit(
    train,
    epochs=args.epochs,
    validation_data=val,
    verbose=0,
    callbacks=[*mldist.keras.default_callbacks(), checkpoint, record],
)
weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
np.save(args.out / f"weights-rank{ctx.rank}.npy", weights)
print(f"attempt {attempt} rank {ctx.rank}: finished at step {record.step}", file=sys.stderr, flush=True)
