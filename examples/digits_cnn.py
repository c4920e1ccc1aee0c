"""The classic CNN of the HPC-centre TensorFlow guides, data-parallel, on real digits.

Handwritten digits from scikit-learn (8x8 grey images, shipped with the package:
nothing is downloaded), a fixed stratified 80/20 split with seed 0.

Run:
    python examples/digits_cnn.py                          # one process
    mldist run -n 2 -- python examples/digits_cnn.py       # two workers
    srun -n 4 python examples/digits_cnn.py                # in a Slurm job

Each rank writes OUT/result-rank{R}.json with the final test loss and accuracy,
and a checksum of its weights (equal on every rank when training was in step).
OUT is ``--out``, else the run directory: ``mldist run``'s ($MLDIST_RUN_DIR, next to the logs
and metrics), or the one RunLog makes on rank 0 (runs/digits_cnn-<time>; under a bare ``srun``
or ``mpiexec`` the other ranks know no shared directory and write their results only with
``--out``). The last line names it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

import mldist
import mldist.data
import mldist.keras


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=1e-3, help="single-worker learning rate (scaled by workers)")
    p.add_argument("--warmup-epochs", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="directory for the result files (default: the run directory)")
    p.add_argument("--checkpoint-dir", help="save checkpoints here and resume from the newest one")
    p.add_argument("--compression", choices=("fp16", "bf16"), help="send the gradients as 16-bit floats")
    return p.parse_args()


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 8, 8, 1) floats in [0, 1], split 80/20 stratified with ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return x_train, y_train, x_test, y_test


def build_model():  # type: ignore[no-untyped-def]
    import keras

    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def weights_sha256(model) -> str:  # type: ignore[no-untyped-def]
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def main() -> None:
    args = parse_args()
    ctx = mldist.init()
    print(f"rank {ctx.rank} of {ctx.size} on {os.uname().nodename} (launcher {ctx.launcher})", flush=True)
    if ctx.is_chief and ctx.size > 1:
        library = f" ({ctx.mpi_library.split(',')[0]})" if ctx.mpi_library else ""
        print(f"collectives: {ctx.communication} engine{library}", flush=True)
    import keras
    import tensorflow as tf

    # One seed on every rank: Keras on JAX builds replicated weights that must start equal
    # (on TensorFlow BroadcastInitialState would also align different starts).
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits_split(args.seed)
    train = mldist.data.shard(
        tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        args.batch_size,
        shuffle_buffer=len(x_train),
        seed=args.seed,
    )
    model = build_model()
    adam = keras.optimizers.Adam(mldist.keras.scale_lr(args.lr))
    opt = mldist.keras.DistributedOptimizer(adam, compression=args.compression)
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks = [*mldist.keras.default_callbacks(), mldist.keras.LearningRateWarmup(args.warmup_epochs)]
    if args.checkpoint_dir:  # last: the warmup reads the target rate before a restore changes it
        callbacks.append(mldist.keras.Checkpoint(args.checkpoint_dir, save_freq="epoch", keep=3))
    start = time.perf_counter()
    model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=2, shuffle=False)  # mldist.data shuffles
    seconds = time.perf_counter() - start
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    result = {
        "rank": ctx.rank,
        "size": ctx.size,
        "epochs": args.epochs,
        "test_loss": float(loss),
        "test_accuracy": float(accuracy),
        "weights_sha256": weights_sha256(model),
        "train_seconds": round(seconds, 3),
        "host": os.uname().nodename,
        "engine": ctx.communication,
    }
    # One directory for everything of the run: --out, else RunLog's (mldist run's on every rank).
    run_dir = next((c.path for c in callbacks if isinstance(c, mldist.keras.RunLog)), None)
    out = Path(args.out) if args.out else run_dir
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".result-rank{ctx.rank}.json.tmp"
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(out / f"result-rank{ctx.rank}.json")
    if ctx.is_chief:
        print(
            f"{ctx.size} worker(s): test accuracy {accuracy:.4f}, loss {loss:.4f}, "
            f"{seconds:.1f} s training; " + (f"results in {out}/" if out else "no results directory"),
            flush=True,
        )


if __name__ == "__main__":
    main()
