"""Worker: a Horovod-style TF2 custom training loop on mldist.horovod. Usage: hvd_mnist_tape.py OUT [--steps N].

Written like Horovod's TF2 MNIST example (hvd.init, GPU pinning by local rank, Adam scaled
by hvd.size(), hvd.DistributedGradientTape, broadcast after the first step, rank 0 saves a
tf.train.Checkpoint), but offline: MNIST-shaped data made from scikit-learn's 8x8 digits.
Every rank starts from its own random weights and trains on its own shard in its own order,
so equal weights at the end mean the broadcast and the gradient averaging both worked.

Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1 set before start, under tf_keras.
Every rank prints one ``RESULT {json}`` line: rank, size, Keras flavour, losses and weight
checksums; rank 0 also writes OUT/ckpt-1.* (files listed in its row under "saved").
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import mldist.horovod as hvd


def digits_as_mnist(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's shard of scikit-learn's digits as (N, 28, 28, 1) float32 in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()  # shipped with scikit-learn: nothing is downloaded
    big = digits.images.repeat(3, axis=1).repeat(3, axis=2)  # 8x8 -> 24x24, nearest neighbour
    images = np.pad(big, ((0, 0), (2, 2), (2, 2)))[..., np.newaxis] / 16.0  # 28x28x1, pixels 0..16 -> [0, 1]
    return images[rank::size].astype(np.float32), digits.target[rank::size].astype(np.int64)


def optimizer_variables(opt: Any) -> list[Any]:
    """The optimizer's variables: a method in legacy optimizers, a list property in Keras 3 and tf_keras 2.11+."""
    found = opt.variables
    return list(found() if callable(found) else found)


def weights_digest(model: Any) -> tuple[float, str]:
    """Sum of absolute values and sha256 of the concatenated float32 bytes of ``model.weights``."""
    arrays = [np.asarray(w, dtype=np.float32) for w in model.weights]
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()
    return float(sum(np.abs(a).sum(dtype=np.float64) for a in arrays)), digest


def main() -> None:
    parser = argparse.ArgumentParser(description="Horovod-style custom training loop on offline digits")
    parser.add_argument("out", type=Path, help="directory for rank 0's checkpoint")
    parser.add_argument("--steps", type=int, default=60, help="steps of one worker; each of N takes STEPS // N")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    hvd.init()

    # One GPU per process, chosen by the local rank (nothing to do on a CPU-only host).
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    tf.keras.utils.set_random_seed(100 + hvd.rank())  # a different start per rank: the broadcast must align it
    images, labels = digits_as_mnist(hvd.rank(), hvd.size())
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.repeat().shuffle(len(images), seed=hvd.rank()).batch(args.batch_size)

    layers = tf.keras.layers
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(28, 28, 1)),
            layers.Conv2D(8, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(16, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(32, activation="relu"),
            layers.Dense(10, activation="softmax"),
        ]
    )
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    opt = tf.keras.optimizers.Adam(0.001 * hvd.size())  # the learning rate grows with the global batch
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)

    @tf.function  # type: ignore[untyped-decorator]
    def training_step(images: tf.Tensor, labels: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss_value = loss_fn(labels, probs)
        tape = hvd.DistributedGradientTape(tape)  # gradients come back averaged over the workers
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        # After the first step (the optimizer has built its slots by then), every worker takes
        # rank 0's model and optimizer state.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer_variables(opt), root_rank=0)
        return loss_value

    losses = []
    for batch, (x, y) in enumerate(dataset.take(args.steps // hvd.size())):
        loss_value = training_step(x, y, batch == 0)
        losses.append(float(loss_value))
        if batch % 10 == 0 and hvd.local_rank() == 0:
            print(f"step {batch:4d}  loss {losses[-1]:.4f}", flush=True)

    saved: list[str] = []
    if hvd.rank() == 0:  # one writer: the others would race on the same files
        args.out.mkdir(parents=True, exist_ok=True)
        prefix = checkpoint.save(str(args.out / "ckpt"))
        saved = sorted(p.name for p in args.out.glob(Path(prefix).name + ".*"))

    k = min(5, len(losses))
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    mean_last = float(hvd.allreduce(tf.constant(last), op=hvd.Average))  # the workers' mean of their own values
    abs_sum, sha = weights_digest(model)
    row = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "keras": tf.keras.__name__,
        "optimizer_module": type(opt).__module__,
        "steps": len(losses),
        "first_loss": first,
        "final_loss": last,
        "final_loss_mean": mean_last,
        "iterations": int(np.asarray(opt.iterations)),
        "weights_abs_sum": abs_sum,
        "weights_sha256": sha,
        "saved": saved,
    }
    print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
