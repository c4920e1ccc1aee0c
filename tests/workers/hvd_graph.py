"""Many collectives in one graph, as Horovod's "fused" tests build them, then one evaluation of all.

Usage: hvd_graph.py eager|function|v1. "v1" builds a TensorFlow 1 graph (eager execution off)
and runs every result in one Session.run, three times, then the object collectives and
broadcast_variables in that session. Prints RESULT {rank, mode, ok, objects}.
"""

from __future__ import annotations

import itertools
import json
import sys

import tensorflow as tf

MODE = sys.argv[1]
if MODE == "v1":
    tf.compat.v1.disable_eager_execution()

import mldist.horovod as hvd  # noqa: E402

hvd.init()
r = hvd.rank()
DTYPES = (tf.int32, tf.int64, tf.float16, tf.float32, tf.float64)


def build() -> tf.Tensor:
    """All checks as one boolean: 15 all-reduces and 15 all-gathers of different dtypes and shapes."""
    checks = []
    for dtype, dim in itertools.product(DTYPES, (1, 2, 3)):
        value = tf.cast(tf.ones([3] * dim) * (r + 1), dtype)
        checks.append(tf.reduce_all(tf.equal(hvd.allreduce(value, op=hvd.Sum), tf.cast(3, dtype))))
        rows = hvd.allgather(tf.cast(tf.fill([r + 1] + [2] * (dim - 1), r), dtype))
        checks.append(tf.equal(tf.shape(rows)[0], 3))
    return tf.reduce_all(checks)


objects: list[object] = []
if MODE == "eager":
    ok = [bool(build()) for _ in range(3)]
elif MODE == "function":
    fused = tf.function(build)
    ok = [bool(fused()) for _ in range(3)]
else:
    everything = build()
    v = tf.compat.v1.Variable([float(r)])
    with tf.compat.v1.Session() as session:
        ok = [bool(session.run(everything)) for _ in range(3)]
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(hvd.broadcast_variables([v], root_rank=1))
        objects = [hvd.broadcast_object({"from": r}, root_rank=1), hvd.allgather_object(r), session.run(v).tolist()]
print("RESULT " + json.dumps({"rank": r, "mode": MODE, "ok": ok, "objects": objects}), flush=True)
