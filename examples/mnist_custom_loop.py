"""MNIST with a custom training loop (tf.GradientTape), data-parallel, from mldist's offline data cache.

Compute nodes need no internet access: fetch MNIST once where there is (a login node),
into the cache that the jobs read (MLDIST_DATA_DIR, else ~/.cache/mldist/data):

    mldist data fetch mnist

Run:
    python examples/mnist_custom_loop.py --epochs 3                  # one process
    mldist run -n 2 -- python examples/mnist_custom_loop.py          # two workers
    srun -n 4 python examples/mnist_custom_loop.py                   # in a Slurm job

The loop is the whole recipe by hand: every rank starts from rank 0's weights
(mldist.broadcast), trains on its own shard (mldist.data.shard), averages its gradients
with the others' (mldist.DistributedGradientTape), and rank 0 alone saves the model to
OUT/mnist_custom_loop.keras. Every rank writes OUT/result-rank{R}.json with the test
accuracy and a checksum of its weights (equal on every rank when training was in step).
Without a fetched MNIST the script stops with one line naming the fetch command.
OUT is ``--out``: under ``mldist run`` its run directory ($MLDIST_RUN_DIR, next to the logs
and metrics), else runs/mnist_custom_loop; the last line names it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import mldist
import mldist.data


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=1e-3, help="single-worker learning rate (scaled by workers)")
    p.add_argument("--limit", type=int, default=0, help="use only the first N training images (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        default=os.environ.get("MLDIST_RUN_DIR") or "runs/mnist_custom_loop",
        help="directory for the model and results (default: mldist run's run directory, else runs/mnist_custom_loop)",
    )
    return p.parse_args()


def load_mnist(limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST from the cache as (N, 28, 28, 1) floats in [0, 1] and int64 labels; one line and exit 2 if absent."""
    try:
        (x_train, y_train), (x_test, y_test) = mldist.data.load("mnist")
    except mldist.ConfigError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if limit:
        x_train, y_train = x_train[:limit], y_train[:limit]
    scale = np.float32(1 / 255)
    return x_train[..., None] * scale, y_train.astype("int64"), x_test[..., None] * scale, y_test.astype("int64")


def build_model() -> Any:
    import keras

    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),  # logits
        ]
    )


def weights_sha256(model: Any) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def train(model: Any, train_ds: Any, epochs: int, lr: float, is_chief: bool) -> float:
    """The training loop; the last epoch's loss averaged over the workers."""
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(lr * mldist.size())  # the global batch grows with the workers
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Each rank built its own random weights: all take rank 0's.
    values = mldist.broadcast([v.value for v in model.variables], root=0)
    for variable, value in zip(model.variables, values, strict=True):
        variable.assign(value)

    @tf.function  # type: ignore[untyped-decorator]
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = mldist.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    mean = float("nan")
    for epoch in range(epochs):
        total, steps = tf.constant(0.0), 0
        for x, y in train_ds:  # the same number of batches on every rank (mldist.data.shard)
            total += step(x, y)
            steps += 1
        mean = float(mldist.allreduce(total / steps, op="mean"))
        if is_chief:
            print(f"epoch {epoch + 1}/{epochs}: loss {mean:.4f} ({steps} steps per worker)", flush=True)
    return mean


def accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    correct = 0
    for start in range(0, len(x), 1000):
        logits = model(x[start : start + 1000], training=False)
        correct += int(np.sum(np.argmax(np.asarray(logits), axis=1) == y[start : start + 1000]))
    return correct / len(x)


def main() -> None:
    args = parse_args()
    x_train, y_train, x_test, y_test = load_mnist(args.limit)  # before init: a missing dataset stops at once
    ctx = mldist.init()
    print(f"rank {ctx.rank} of {ctx.size} on {os.uname().nodename} (launcher {ctx.launcher})", flush=True)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(args.seed + ctx.rank)  # different starts on purpose: the broadcast aligns them
    train_ds = mldist.data.shard(
        tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        args.batch_size,
        shuffle_buffer=len(x_train),
        seed=args.seed,
    )
    model = build_model()
    start = time.perf_counter()
    loss = train(model, train_ds, args.epochs, args.lr, ctx.is_chief)
    seconds = time.perf_counter() - start
    test_accuracy = accuracy(model, x_test, y_test)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if ctx.is_chief:  # one writer: the others would race on the same file
        tmp = out / f".mnist_custom_loop.{os.getpid()}.keras"
        model.save(tmp)
        tmp.replace(out / "mnist_custom_loop.keras")
    result = {
        "rank": ctx.rank,
        "size": ctx.size,
        "epochs": args.epochs,
        "train_images": len(x_train),
        "train_loss": loss,
        "test_accuracy": test_accuracy,
        "weights_sha256": weights_sha256(model),
        "train_seconds": round(seconds, 3),
    }
    tmp_result = out / f".result-rank{ctx.rank}.json.tmp"
    tmp_result.write_text(json.dumps(result, indent=2) + "\n")
    tmp_result.replace(out / f"result-rank{ctx.rank}.json")
    if ctx.is_chief:
        print(
            f"{ctx.size} worker(s): test accuracy {test_accuracy:.4f}, {seconds:.1f} s training; results in {out}/",
            flush=True,
        )


if __name__ == "__main__":
    main()
