"""One benchmark process: Keras fit of a model on random data of its input shape.

Usage: bench_worker.py {plain,mldist,mldist-tiny,compute,allreduce,table} --threads T --steps S
       [--warmup W] [--model cnn|mobilenetv2] [--batch B] [--one-core [--core C|rank]]
       [--compression fp16|bf16] [--wire IFACE]
Prints ``RESULT {json}`` with this process's images per second over the timed steps.
``compute`` is ``mldist`` with the all-reduce replaced by an identity (a plain optimizer, the
same callbacks): each rank trains on its own, the compute-alone reference. ``--wire eth0``
adds the bytes this host sent on that interface per timed step, and the model's variable sizes.
``mldist-tiny`` all-reduces 4 bytes per step instead of the gradient (each rank applies its
own gradient): the fixed cost of having any collective in the step. ``allreduce`` instead
times mldist.allreduce of the model's gradient size and of 1,000 floats; ``table`` times
mldist.allreduce (in a tf.function) from 4 B to 64 MB, and raw mpi4py Allreduce on numpy
arrays of the same sizes when the engine is MPI.
"""

from __future__ import annotations

import argparse
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("mode", choices=("plain", "proto", "mldist", "mldist-tiny", "compute", "allreduce", "table"))
p.add_argument("--model", choices=("cnn", "mobilenetv2"), default="cnn")
p.add_argument("--threads", type=int, required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--warmup", type=int, default=15)
p.add_argument("--batch", type=int, default=0, help="per-worker batch (default: 64 for cnn, 32 for mobilenetv2)")
p.add_argument("--one-core", action="store_true", help="pin this process to CPU 0")
p.add_argument("--core", default="0", help="the CPU --one-core pins to, or 'rank': Open MPI's rank of this process")
p.add_argument("--compression", default=None, help="DistributedOptimizer's compression (mldist mode)")
p.add_argument("--wire", default="", help="an interface whose sent bytes per step to report (e.g. eth0)")
args = p.parse_args()
if args.one_core:  # before TensorFlow starts its threads: they inherit the mask
    core = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) if args.core == "rank" else int(args.core)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[core % len(cpus)]})


def sent_bytes(iface: str) -> int:
    """Bytes this network namespace has sent on ``iface`` (/proc/net/dev is per namespace)."""
    for line in open("/proc/net/dev").read().splitlines()[2:]:  # noqa: SIM115 - a small proc file
        name, _, counters = line.partition(":")
        if name.strip() == iface:
            return int(counters.split()[8])
    raise SystemExit(f"bench_worker.py: error: --wire {iface!r}: no such interface in /proc/net/dev")


rank, size = 0, 1
if args.mode == "proto":
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
elif args.mode != "plain":
    import mldist
    import mldist.keras

    ctx = mldist.init()
    rank, size = ctx.rank, ctx.size

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from models import build  # noqa: E402  (benchmarks/ is the script's directory)

if args.mode in ("plain", "proto"):
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)

model, shape, default_batch = build(args.model)
batch = args.batch or default_batch


class TinySync(keras.optimizers.SGD):  # type: ignore[misc]
    """SGD whose step waits for a 4-byte all-reduce: a collective's cost without the bytes."""

    def apply(self, grads: list[tf.Tensor], trainable_variables: object = None) -> object:
        s = mldist.allreduce(tf.reshape(tf.reduce_sum(grads[0]), [1]))
        return super().apply([g + 0.0 * s[0] for g in grads], trainable_variables)


class Proto(keras.optimizers.SGD):  # type: ignore[misc]
    """The bare prototype: one MPI_Allreduce of the concatenated gradient in a numpy_function."""

    def apply(self, grads: list[tf.Tensor], trainable_variables: object = None) -> object:
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)

        def reduce(a: np.ndarray) -> np.ndarray:
            out = np.empty_like(a)
            MPI.COMM_WORLD.Allreduce(a, out, MPI.SUM)
            return out

        total = tf.numpy_function(reduce, [flat], tf.float32, stateful=True) / size
        parts = tf.split(total, [int(np.prod(g.shape)) for g in grads])
        return super().apply([tf.reshape(p, g.shape) for p, g in zip(parts, grads, strict=True)], trainable_variables)


OPTIMIZERS = {"proto": Proto, "mldist-tiny": TinySync}
opt = OPTIMIZERS.get(args.mode, keras.optimizers.SGD)(0.01)
callbacks: list[keras.callbacks.Callback] = []
if args.mode == "mldist":
    opt = mldist.keras.DistributedOptimizer(opt, compression=args.compression)
    callbacks = mldist.keras.default_callbacks()
elif args.mode == "compute":  # the same run without the all-reduce: each rank applies its own gradient
    callbacks = mldist.keras.default_callbacks()
# TensorFlow's CPU step runs best without XLA; on JAX every step is XLA-compiled (False would run it eagerly).
model.compile(opt, "sparse_categorical_crossentropy", jit_compile=keras.config.backend() == "jax")


def timed(fn: object, value: object, repeats: int) -> float:
    """Median seconds of ``fn(value)`` over ``repeats`` calls after a warm-up (a result is read each time)."""
    samples = []
    for i in range(args.warmup + repeats):
        t0 = time.perf_counter()
        out = fn(value)  # type: ignore[operator]
        np.asarray(out[0] if isinstance(out, list | tuple) else out).ravel()[:1].tolist()
        if i >= args.warmup:
            samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


if args.mode == "table":
    rows = []
    for nbytes in (4, 1024, 65536, 1 << 20, 8 << 20, 64 << 20):
        n = max(1, nbytes // 4)
        repeats = max(5, min(args.steps, (256 << 20) // nbytes))
        reduce_fn = tf.function(lambda v: mldist.allreduce([v], op="sum"))
        row = {"bytes": n * 4, "engine_s": timed(reduce_fn, tf.ones([n]), repeats)}
        if ctx.communication == "mpi":
            from mpi4py import MPI

            out = np.empty(n, np.float32)

            def raw(a: np.ndarray, out: np.ndarray = out) -> np.ndarray:
                MPI.COMM_WORLD.Allreduce(a, out, MPI.SUM)
                return out

            row["raw_s"] = timed(raw, np.ones(n, np.float32), repeats)
        rows.append(row)
    print("RESULT " + json.dumps({"rank": rank, "engine": ctx.communication, "rows": rows}), flush=True)
    raise SystemExit(0)


class Timer(keras.callbacks.Callback):  # type: ignore[misc]
    start = 0.0
    end = 0.0
    sent_start = 0  # --wire: the interface's sent bytes at the first and after the last timed step
    sent_end = 0

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if batch == args.warmup:
            self.sent_start = sent_bytes(args.wire) if args.wire else 0
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if batch == args.warmup + args.steps - 1:  # before other callbacks' end-of-training work
            self.end = time.perf_counter()
            self.sent_end = sent_bytes(args.wire) if args.wire else 0


if args.mode == "allreduce":
    grad_floats = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    times = {}
    for label, n in (("gradient", grad_floats), ("tiny", 1000)):
        value = tf.ones([n])
        reduce_fn = tf.function(lambda v: mldist.allreduce([v]))
        for _ in range(args.warmup):
            reduce_fn(value)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            out = reduce_fn(value)
        out[0].numpy()
        times[label] = (time.perf_counter() - t0) / args.steps
    result = {"rank": rank, "gradient_bytes": grad_floats * 4, "allreduce_ms": times["gradient"] * 1e3}
    result["tiny_allreduce_ms"] = times["tiny"] * 1e3
    print("RESULT " + json.dumps(result), flush=True)
    raise SystemExit(0)

spent = [0.0]  # seconds in mldist's callbacks' per-step hooks during the timed steps


def timed_hooks(cb: keras.callbacks.Callback) -> keras.callbacks.Callback:
    """``cb`` with its per-step hooks timed (the benchmark's own instrumentation)."""
    for hook in ("on_train_batch_begin", "on_train_batch_end"):
        original = getattr(cb, hook)

        def run(batch: int, logs: object = None, original: object = original) -> None:
            t0 = time.perf_counter()
            original(batch, logs)  # type: ignore[operator]
            if args.warmup <= batch < args.warmup + args.steps:
                spent[0] += time.perf_counter() - t0

        setattr(cb, hook, run)
    return cb


callbacks = [timed_hooks(cb) for cb in callbacks]
timer = Timer()
rng = np.random.default_rng(rank)
x = rng.random((batch, *shape), dtype=np.float32)  # one batch, repeated: the input pipeline costs nothing
y = rng.integers(0, 10, batch)
ds = tf.data.Dataset.from_tensors((x, y)).repeat(args.warmup + args.steps)
model.fit(ds, epochs=1, verbose=0, callbacks=[*callbacks, timer])
ips = args.steps * batch / (timer.end - timer.start)
result = {"rank": rank, "size": size, "images_per_second": ips, "callback_ms_per_step": spent[0] / args.steps * 1e3}
if args.wire:
    result["wire_bytes_per_step"] = (timer.sent_end - timer.sent_start) / args.steps
    result["variable_bytes"] = [int(np.prod(v.shape)) * 4 for v in model.trainable_variables]
print("RESULT " + json.dumps(result), flush=True)
