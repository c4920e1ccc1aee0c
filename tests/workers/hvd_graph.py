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


def error_type(build: object) -> str:
    """The TensorFlow error class that evaluating ``build()`` raises in a graph of its own ("none" if none).

    A graph of its own: mldist runs a TF1 graph's collectives in build order, each after the one
    built before it, so a failed one would fail every later evaluation in that graph.
    """
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        try:
            session.run(build())  # type: ignore[operator]
        except tf.errors.OpError as exc:
            return next(c.__name__ for c in type(exc).__mro__ if c.__module__.startswith("tensorflow"))
    return "none"


def graph_checks(session: tf.compat.v1.Session) -> dict[str, object]:
    """Horovod's behaviour in a TensorFlow 1 graph, as its own test file checks it."""
    out: dict[str, object] = {}
    # broadcast_ in place: evaluating its result broadcasts, and the variable holds root's value.
    var = tf.compat.v1.Variable([float(r)] * 2)
    session.run(var.initializer)
    (received,) = hvd.broadcast_([var], root_rank=1)
    out["broadcast_inplace"] = [session.run(received).tolist(), session.run(var).tolist()]
    session.run(var.assign([5.0 + r] * 2))
    session.run(hvd.broadcast_global_variables(root_rank=0))  # every global variable, in a graph
    out["global_variables"] = session.run(var).tolist()
    # broadcast's gradient: the average on the root, zero elsewhere; no rank waits for another.
    x = tf.ones([2]) * (r + 1)
    out["broadcast_grad"] = session.run(tf.gradients(hvd.broadcast(x, 0), x)[0]).tolist()
    # Ranks that disagree: Horovod's FailedPreconditionError, also for one size in two shapes.
    out["other_size"] = error_type(lambda: hvd.allreduce(tf.ones([3 + r])))
    out["other_shape"] = error_type(lambda: hvd.allreduce(tf.ones([6] if r == 0 else [2, 3])))
    out["other_dtype"] = error_type(lambda: hvd.allreduce(tf.ones([3], tf.float32 if r == 0 else tf.float64)))
    out["agree_after"] = session.run(hvd.allreduce(tf.ones([2]), op=hvd.Sum)).tolist()  # the world goes on
    return out


objects: list[object] = []
graph: dict[str, object] = {}
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
        graph = graph_checks(session)
print("RESULT " + json.dumps({"rank": r, "mode": MODE, "ok": ok, "objects": objects, "graph": graph}), flush=True)
