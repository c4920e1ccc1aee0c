"""MNIST with Keras ``fit``, data-parallel, from mldist's offline data cache.

Compute nodes need no internet access: fetch MNIST once where there is (a login node),
into the cache that the jobs read (MLDIST_DATA_DIR, else ~/.cache/mldist/data):

    mldist data fetch mnist

Run:
    python examples/mnist_fit.py --epochs 3                  # one process
    mldist run -n 2 -- python examples/mnist_fit.py          # two workers
    srun -n 4 python examples/mnist_fit.py                   # in a Slurm job

Each worker trains on its shard of the 60000 training images; rank 0 saves the model to
OUT/mnist_fit.keras. Every rank writes OUT/result-rank{R}.json with the test loss and
accuracy and a checksum of its weights (equal on every rank when training was in step).
Without a fetched MNIST the script stops with one line naming the fetch command.
OUT is ``--out``: under ``mldist run`` its run directory ($MLDIST_RUN_DIR, next to the logs
and metrics), else runs/mnist_fit; the last line names it.
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
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=0, help="use only the first N training images (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        default=os.environ.get("MLDIST_RUN_DIR") or "runs/mnist_fit",
        help="directory for the model and the result files (default: mldist run's run directory, else runs/mnist_fit)",
    )
    p.add_argument("--checkpoint-dir", help="save checkpoints here and resume from the newest one")
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
            keras.layers.Dropout(0.25),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def weights_sha256(model: Any) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def save_model(model: Any, out: Path) -> Path:
    """Rank 0 only: write the model under a temporary name, then rename it (never a half-written file)."""
    final = out / "mnist_fit.keras"
    tmp = out / f".mnist_fit.{os.getpid()}.keras"
    with mldist.keras.single_process():  # on JAX, variables made under the distribution need every rank
        model.save(tmp)
    tmp.replace(final)
    return final


def main() -> None:
    args = parse_args()
    x_train, y_train, x_test, y_test = load_mnist(args.limit)  # before init: a missing dataset stops at once
    ctx = mldist.init()
    print(f"rank {ctx.rank} of {ctx.size} on {os.uname().nodename} (launcher {ctx.launcher})", flush=True)
    import keras
    import tensorflow as tf  # mldist.keras below loads on first use, after the data check

    # One seed on every rank: Keras on JAX builds replicated weights that must start equal
    # (on TensorFlow BroadcastInitialState would also align different starts).
    keras.utils.set_random_seed(args.seed)
    train = mldist.data.shard(
        tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        args.batch_size,
        shuffle_buffer=len(x_train),
        seed=args.seed,
    )
    model = build_model()
    opt = mldist.keras.DistributedOptimizer(keras.optimizers.Adam(mldist.keras.scale_lr(args.lr)))
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks = [*mldist.keras.default_callbacks(), mldist.keras.LearningRateWarmup(args.warmup_epochs)]
    if args.checkpoint_dir:  # last: the warmup reads the target rate before a restore changes it
        callbacks.append(mldist.keras.Checkpoint(args.checkpoint_dir, save_freq="epoch", keep=3))
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=2, shuffle=False)  # mldist.data shuffles
    seconds = time.perf_counter() - start
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=512, verbose=0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if ctx.is_chief:
        print(f"saved {save_model(model, out)}", flush=True)
    result = {
        "rank": ctx.rank,
        "size": ctx.size,
        "epochs": args.epochs,
        "train_images": len(x_train),
        "test_loss": float(loss),
        "test_accuracy": float(accuracy),
        "weights_sha256": weights_sha256(model),
        "train_seconds": round(seconds, 3),
    }
    tmp = out / f".result-rank{ctx.rank}.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out / f"result-rank{ctx.rank}.json")
    if ctx.is_chief:
        print(
            f"{ctx.size} worker(s): test accuracy {accuracy:.4f}, loss {loss:.4f}, "
            f"{seconds:.1f} s training; results in {out}/",
            flush=True,
        )


if __name__ == "__main__":
    main()
