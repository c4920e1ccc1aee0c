"""Worker for the collective tests: runs every check in one process, prints RESULT json."""

from __future__ import annotations

import json
import sys

import mldist
import mldist.data

ctx = mldist.init()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

r, n = ctx.rank, ctx.size
out: dict[str, object] = {"rank": r, "size": n, "engine": ctx.communication}

# Eager calls on nested structures and dtypes.
red = mldist.allreduce({"a": tf.fill([3], float(r + 1)), "b": [tf.constant([[r]], tf.int32)]}, op="sum")
out["sum_a"] = red["a"].numpy().tolist()
out["sum_b"] = red["b"][0].numpy().tolist()
out["mean"] = mldist.allreduce(tf.constant([float(r)]), op="mean").numpy().tolist()
out["max"] = mldist.allreduce(tf.constant([r, -r]), op="max").numpy().tolist()
out["min"] = mldist.allreduce(tf.constant([r, -r]), op="min").numpy().tolist()
out["fp16"] = mldist.allreduce(tf.constant([1.5 + r]), compression="fp16").numpy().tolist()
out["bcast"] = [
    t.numpy().tolist() for t in mldist.broadcast([tf.constant([r + 7.0]), tf.constant([r == n - 1])], root=n - 1)
]
out["gather"] = mldist.allgather(tf.fill([r + 1, 2], r)).numpy().tolist()
# Every numeric dtype: sum, max and a broadcast; 16-bit floats are summed in float32 on MPI.
dtypes = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "complex64")
out["dtypes"] = {
    d: [
        tf.cast(mldist.allreduce(tf.cast(tf.fill([3], r + 1), d), op="sum"), tf.float64).numpy().real.tolist(),
        tf.cast(mldist.broadcast(tf.cast(tf.fill([2], r + 5), d), root=n - 1), tf.float64).numpy().real.tolist(),
    ]
    + (
        []
        if d == "complex64"
        else [tf.cast(mldist.allreduce(tf.cast([r, 7 - r], d), op="max"), tf.float64).numpy().tolist()]
    )
    for d in dtypes
}
# Results kept alive while more calls of the same size run: none may be overwritten (buffer reuse).
kept_fn = tf.function(lambda v: mldist.allreduce([v], op="sum"))
kept = [kept_fn(tf.fill([300_000], float(i + r)))[0] for i in range(6)]
out["kept"] = [float(k[0]) for k in kept]

# The MPI engine reduces in place: the caller's tensors and variables must keep their values.
x, var = tf.fill([4], float(r + 1)), tf.Variable(tf.fill([4], float(r + 1)))
mldist.allreduce(x, op="sum"), mldist.allreduce(var, op="max"), mldist.allreduce([x, var], op="mean")
pair = tf.function(lambda v: (v * 2, mldist.allreduce(v * 2, op="sum")))(x)
out["untouched"] = [float(x[0]), float(var[0]), float(pair[0][0]), float(pair[1][0])]


def collectives_in(op: tf.Operation) -> int:
    """TensorFlow's engine: one CollectiveReduce op per bucket; MPI: one MPI_Allreduce per output."""
    if op.type.startswith("CollectiveReduce"):
        return 1
    return len(op.outputs) if op.type in ("PyFunc", "EagerPyFunc") and "mpi_allreduce" in op.name else 0


# Traced: count the collective ops per bucket plan (3 float tensors of 40 B + 1 int tensor).
def count(bucket_bytes: int) -> int:
    @tf.function
    def f(a, b, c, d):  # type: ignore[no-untyped-def]
        return mldist.allreduce([a, b, c, d], op="sum", bucket_bytes=bucket_bytes)

    specs = [tf.TensorSpec([10], tf.float32)] * 3 + [tf.TensorSpec([4], tf.int32)]
    graph = f.get_concrete_function(*specs).graph
    seen, todo = 0, [graph]
    while todo:
        g = todo.pop()
        seen += sum(collectives_in(op) for op in g.get_operations())
        todo += [fn.graph for fn in getattr(g, "_functions", {}).values() if hasattr(fn, "graph")]
    return seen


out["collectives_one_bucket"] = count(1 << 20)
out["collectives_small_buckets"] = count(80)

# Data: uneven shards (11 elements over the workers) must give equal step counts.
ds = mldist.data.shard(tf.data.Dataset.range(11 + r * 0), batch_size=2)
out["steps"] = sum(1 for _ in ds)
files = [f"f{i}" for i in range(max(1, n - 1))]  # fewer files than workers: element sharding
fds = mldist.data.shard_files(files, lambda f: tf.data.Dataset.from_tensors(f).repeat(5), batch_size=1)
out["file_steps"] = sum(1 for _ in fds)
out["np"] = np.__version__ != ""
print("RESULT " + json.dumps(out), flush=True)
sys.stdout.flush()
