"""Worker for the overlap and compression checks (issue 49): prints RESULT json.

- ``order``: the size of each collective a tape step starts, in the order they start, with 40-byte
  buckets: the last layer's gradients first (backprop's order), one collective per bucket;
- ``independent``: the first bucket's collective does not read the first layer's gradient, so it can
  start while backprop still computes that one;
- ``same_bits``: gradients averaged in small buckets equal those averaged in one bucket, bit for bit;
- ``bf16``: means sent as bfloat16: exact values stay exact, and 1 + 2**-10 arrives rounded to 1;
- ``wire``: what the engine moves for a bf16 bucket (16 bits on MPI).
"""

from __future__ import annotations

import json

import numpy as np

import mldist

ctx = mldist.init()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

r = ctx.rank
keras.utils.set_random_seed(7)  # the same weights on both ranks; the data differs
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
x = tf.constant(np.random.default_rng(r).random((5, 3)), tf.float32)
variables = model.trainable_variables  # kernel 3x4, bias 4, kernel 4x2, bias 2


def step(bucket_bytes: int, compression: str | None = None):  # type: ignore[no-untyped-def]
    @tf.function
    def run(x):  # type: ignore[no-untyped-def]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        tape = mldist.DistributedGradientTape(tape, bucket_bytes=bucket_bytes, compression=compression)
        return tape.gradient(loss, variables)

    return run


def starts(graph: tf.Graph) -> list[tf.Operation]:
    """The op that starts each collective, in the order they were built (the order they start)."""
    if ctx.communication == "mpi":
        return [op for op in graph.get_operations() if op.type == "PyFunc" and "mpi_start" in op.name]
    return [op for op in graph.get_operations() if op.type.startswith("CollectiveReduce")]


def reads(op: tf.Operation) -> set[str]:
    """The names of the ops whose outputs ``op`` reads, transitively (control edges left out)."""
    seen: set[str] = set()
    todo = [t.op for t in op.inputs]
    while todo:
        o = todo.pop()
        if o.name not in seen:
            seen.add(o.name)
            todo += [t.op for t in o.inputs]
    return seen


small, whole = step(40), step(64 << 20)
ops = starts(small.get_concrete_function(tf.TensorSpec([5, 3], tf.float32)).graph)
out: dict[str, object] = {"rank": r, "engine": ctx.communication}
out["order"] = [int(op.inputs[0].shape.num_elements()) for op in ops]
# The last bucket holds the first kernel's gradient; the first bucket's collective must not read it.
out["independent"] = ops[-1].inputs[0].op.name not in reads(ops[0])
out["same_bits"] = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(small(x), whole(x), strict=True))
exact = mldist.allreduce(tf.constant([1.5 + r]), compression="bf16")
rounded = mldist.allreduce(tf.constant([1.0 + 2.0**-10]), compression="bf16")
kept = mldist.allreduce(tf.constant([1.0 + 2.0**-10]), compression="fp16")
out["bf16"] = [float(exact[0]), float(rounded[0]), float(kept[0])]
# What the engine moves for a bf16 bucket: its 16 bits on MPI (its own sum); float32 on RING (widened).
wire = starts(tf.function(lambda v: mldist.allreduce([v], compression="bf16")).get_concrete_function(x).graph)
out["wire"] = [op.inputs[0].dtype.name for op in wire]
full, half = whole(x), step(40, "bf16")(x)
# bfloat16 keeps 8 significant bits: each gradient within 2**-7 of the float32 one, relatively.
errors = [float(np.linalg.norm(a - b) / np.linalg.norm(a)) for a, b in zip(full, half, strict=True)]
out["bf16_tape"] = [0 < e < 2**-7 for e in errors]
print("RESULT " + json.dumps(out), flush=True)
