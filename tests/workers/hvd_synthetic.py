"""Worker: a Horovod-style synthetic benchmark on mldist.horovod. Usage: hvd_synthetic.py [--model M] [options].

Written like Horovod's TF2 synthetic benchmark: random images (made once, different on every
rank), a ``@tf.function`` step with hvd.DistributedGradientTape (optionally fp16 on the
wire), variables broadcast from rank 0 after the first step, iterations timed with timeit.
Models: ``cnn`` (a small CNN on 32x32x3, the default) or any tf.keras.applications name,
e.g. ``MobileNetV2`` (weights=None, 64x64x3, 10 classes).

Rank 0 prints the images per second per worker and in total; every rank prints one
``RESULT {json}`` line with its mean images per second and a sha256 of its weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import timeit
from typing import Any

import numpy as np
import tensorflow as tf

import mldist.horovod as hvd

parser = argparse.ArgumentParser(
    description="Horovod-style synthetic benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--model", default="cnn", help="cnn, or a tf.keras.applications model such as MobileNetV2")
parser.add_argument("--batch-size", type=int, default=32, help="images per step and worker")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps after the first")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per timed iteration")
parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
parser.add_argument("--seed", type=int, default=0, help="the data and initial weights use SEED + rank")
args = parser.parse_args()

hvd.init()

# One GPU per process, chosen by the local rank (nothing to do on a CPU-only host).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
device = "GPU" if gpus else "CPU"


def build(name: str) -> tuple[Any, tuple[int, int, int]]:
    """The model and its input shape."""
    if name != "cnn":
        shape = (64, 64, 3)
        return getattr(tf.keras.applications, name)(weights=None, input_shape=shape, classes=10), shape
    shape = (32, 32, 3)
    layers = tf.keras.layers
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=shape),
            layers.Conv2D(16, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(10, activation="softmax"),
        ]
    )
    return model, shape


def optimizer_variables(opt: Any) -> list[Any]:
    """The optimizer's variables: a method in legacy optimizers, a list property in Keras 3 and tf_keras 2.11+."""
    found = opt.variables
    return list(found() if callable(found) else found)


tf.keras.utils.set_random_seed(args.seed + hvd.rank())  # different weights and data per rank
model, shape = build(args.model)
opt = tf.keras.optimizers.SGD(0.01)
rng = np.random.default_rng(args.seed + hvd.rank())
data = tf.constant(rng.random((args.batch_size, *shape), dtype=np.float32))
target = tf.constant(rng.integers(0, 10, (args.batch_size, 1)), dtype=tf.int64)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


@tf.function  # type: ignore[untyped-decorator]
def benchmark_step(first_batch: bool) -> None:
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target, probs))
    tape = hvd.DistributedGradientTape(tape, compression=compression)  # averaged over the workers
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    # After the first step (the optimizer's state exists by then): everyone takes rank 0's state.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer_variables(opt), root_rank=0)


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


log(f"model {args.model}, batch size {args.batch_size}, {hvd.size()} {device} worker(s)")
log(f"gradient compression: {'fp16' if args.fp16_allreduce else 'none'}")
with tf.device(device):
    log("warming up")
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

    log("timing")
    img_secs = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
        log(f"iteration {i}: {img_secs[-1]:.1f} img/sec per worker")

mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))  # 95% band of the iterations
log(f"Img/sec per worker: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} worker(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")

weights = b"".join(np.ascontiguousarray(np.asarray(w, dtype=np.float32)).tobytes() for w in model.weights)
row = {
    "rank": hvd.rank(),
    "size": hvd.size(),
    "model": args.model,
    "keras": tf.keras.__name__,
    "compression": "fp16" if args.fp16_allreduce else "none",
    "batch_size": args.batch_size,
    "img_per_sec": mean,
    "img_per_sec_conf": conf,
    "iterations": int(np.asarray(opt.iterations)),
    "weights_sha256": hashlib.sha256(weights).hexdigest(),
}
print("RESULT " + json.dumps(row), flush=True)
