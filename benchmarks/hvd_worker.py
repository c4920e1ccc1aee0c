"""One Horovod-style synthetic benchmark process on mldist.horovod (driven by horovod_synthetic.py).

Usage: hvd_worker.py [--model cnn|mobilenetv2] [--batch-size B] [--num-warmup-batches W]
       [--num-batches-per-iter K] [--num-iters I] [--fp16-allreduce] [--one-core [--core C|rank]]
       [--horovod]

A model from models.py on random data of its input shape (made once, different per rank),
a ``@tf.function`` step with hvd.DistributedGradientTape, variables broadcast from rank 0
after the first step, I timed iterations of K steps each. Rank 0 prints images per second
per worker and in total; every rank prints ``RESULT {json}`` with its mean images per second.
``--horovod`` runs the same program on Horovod itself (``horovod.tensorflow``) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import timeit
from typing import Any

p = argparse.ArgumentParser()
p.add_argument("--model", choices=("cnn", "mobilenetv2"), default="cnn")
p.add_argument("--batch-size", type=int, default=0, help="per-worker batch (default: 64 for cnn, 32 for mobilenetv2)")
p.add_argument("--num-warmup-batches", type=int, default=20)
p.add_argument("--num-batches-per-iter", type=int, default=20)
p.add_argument("--num-iters", type=int, default=10)
p.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
p.add_argument("--one-core", action="store_true", help="pin this process to one CPU")
p.add_argument("--core", default="0", help="the CPU --one-core pins to, or 'rank': Open MPI's rank of this process")
p.add_argument("--horovod", action="store_true", help="Horovod itself (horovod.tensorflow), not mldist.horovod")
args = p.parse_args()
if args.one_core:  # before TensorFlow starts its threads: they inherit the mask
    core = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) if args.core == "rank" else int(args.core)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[core % len(cpus)]})

import keras  # noqa: E402  (Keras 3, as models.py builds with it)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if args.horovod:
    import horovod.tensorflow as hvd
else:
    import mldist.horovod as hvd

hvd.init()

from models import build  # noqa: E402  (benchmarks/ is the script's directory)

model, shape, default_batch = build(args.model)
batch = args.batch_size or default_batch
opt = keras.optimizers.SGD(0.01)
rng = np.random.default_rng(hvd.rank())
data = tf.constant(rng.random((batch, *shape), dtype=np.float32))
target = tf.constant(rng.integers(0, 10, batch), dtype=tf.int64)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


def optimizer_variables(opt: Any) -> list[Any]:
    found = opt.variables
    return list(found() if callable(found) else found)


@tf.function  # type: ignore[untyped-decorator]
def step(first_batch: bool) -> None:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(target, model(data, training=True)))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    # Horovod 0.28.1's tape keys its sources by tf.Variable.ref(), which Keras 3's variables lack: theirs.
    sources = [v.value for v in model.trainable_variables] if args.horovod else model.trainable_variables
    grads = tape.gradient(loss, sources)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer_variables(opt), root_rank=0)


step(first_batch=True)
timeit.timeit(lambda: step(first_batch=False), number=args.num_warmup_batches)
rates = []
for _ in range(args.num_iters):
    seconds = timeit.timeit(lambda: step(first_batch=False), number=args.num_batches_per_iter)
    rates.append(batch * args.num_batches_per_iter / seconds)
mean, conf = float(np.mean(rates)), float(1.96 * np.std(rates))
if hvd.rank() == 0:
    print(f"Img/sec per worker: {mean:.1f} +-{conf:.1f}", flush=True)
    print(f"Total img/sec on {hvd.size()} worker(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}", flush=True)
print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "img_per_sec": mean}), flush=True)
