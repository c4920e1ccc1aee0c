"""Worker: Horovod-style Keras ``fit`` on mldist.horovod.tensorflow.keras. Usage: hvd_keras_mnist.py OUT [--epochs E].

Written like Horovod's TF2 Keras MNIST example (hvd.DistributedOptimizer, the broadcast,
metric-average and learning-rate warm-up callbacks, a ModelCheckpoint on rank 0 only,
progress printed by rank 0), but offline: MNIST-shaped data made from scikit-learn's 8x8
digits, a different shard and shuffle order per rank and a different initial model.

Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1 set before start, under tf_keras (the
checkpoint is OUT/checkpoint-{epoch}.keras, or .h5 under tf_keras). Every rank prints one
``RESULT {json}`` line: rank, size, Keras flavour, weight checksums, the history, the
learning rate after the first step, at every epoch end and after training.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import mldist.horovod.tensorflow.keras as hvd

LEGACY = tf.keras.__name__.startswith("tf_keras")  # TF_USE_LEGACY_KERAS=1: Keras 2 (tf_keras)


def digits_as_mnist(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's shard of scikit-learn's digits as (N, 28, 28, 1) float32 in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()  # shipped with scikit-learn: nothing is downloaded
    big = digits.images.repeat(3, axis=1).repeat(3, axis=2)  # 8x8 -> 24x24, nearest neighbour
    images = np.pad(big, ((0, 0), (2, 2), (2, 2)))[..., np.newaxis] / 16.0  # 28x28x1, pixels 0..16 -> [0, 1]
    return images[rank::size].astype(np.float32), digits.target[rank::size].astype(np.int64)


def learning_rate(model: Any) -> float:
    return float(np.asarray(model.optimizer.learning_rate))


class LearningRateLog(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """Records the learning rate after the first step and at the end of every epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.first_step: float | None = None
        self.epoch_ends: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.first_step is None:
            self.first_step = learning_rate(self.model)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch_ends.append(learning_rate(self.model))


def main() -> None:
    parser = argparse.ArgumentParser(description="Horovod-style Keras fit on offline digits")
    parser.add_argument("out", type=Path, help="directory for rank 0's checkpoints")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="one worker's steps per epoch; N take STEPS // N")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    hvd.init()

    # One GPU per process, chosen by the local rank (nothing to do on a CPU-only host).
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    tf.keras.utils.set_random_seed(200 + hvd.rank())  # a different start per rank: the broadcast must align it
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

    scaled_lr = 0.001 * hvd.size()  # the learning rate grows with the global batch
    opt = tf.keras.optimizers.Adam(scaled_lr)
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    # tf_keras: run the optimizer's own gradient path. Keras 3's compile has no such argument.
    legacy_only = {"experimental_run_tf_function": False} if LEGACY else {}
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        optimizer=opt,
        metrics=["accuracy"],
        **legacy_only,
    )

    lr_log = LearningRateLog()
    callbacks = [
        # Rank 0's initial model and optimizer state go to every worker after the first step.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Epoch-end metrics averaged over the workers; keep it before callbacks that read metrics.
        hvd.callbacks.MetricAverageCallback(),
        # Start at scaled_lr / size and reach scaled_lr at the end of the second epoch.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
        lr_log,
    ]
    if hvd.rank() == 0:  # one writer; Keras 3 wants a .keras (or .weights.h5) name
        suffix = "h5" if LEGACY else "keras"
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(str(args.out / f"checkpoint-{{epoch}}.{suffix}")))

    history = model.fit(
        dataset,
        steps_per_epoch=args.steps // hvd.size(),
        callbacks=callbacks,
        epochs=args.epochs,
        verbose=1 if hvd.rank() == 0 else 0,
    )

    arrays = [np.asarray(w, dtype=np.float32) for w in model.weights]
    row = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "keras": tf.keras.__name__,
        "optimizer_module": type(model.optimizer).__module__,
        "scaled_lr": scaled_lr,
        "lr_first_step": lr_log.first_step,
        "lr_epoch_ends": lr_log.epoch_ends,
        "lr_final": learning_rate(model),
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "weights_abs_sum": float(sum(np.abs(a).sum(dtype=np.float64) for a in arrays)),
        "weights_sha256": hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest(),
        "checkpoints": sorted(p.name for p in args.out.glob("checkpoint-*")) if hvd.rank() == 0 else [],
    }
    print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
