"""Horovod behaviours its own test suite checks, on 2 ranks, written as a Horovod user would.

Grouped all-reduce of IndexedSlices (alone and mixed), pre/post-scaling as Horovod computes
it, grouped reduce-scatter with every argument, alltoall of uint8 / empty / equal splits,
in-place broadcast of several variables, gradients of the gathering and scattering
collectives inside tf.function, and Horovod's error types for sparse misuse. Prints
"CHECKED name" per check and RESULT {rank, checks}.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import mldist.horovod as hvd

hvd.init()
r = hvd.rank()
checks: list[str] = []


def check(name: str, got: Any, want: Any) -> None:
    got = got.numpy() if hasattr(got, "numpy") else got
    assert np.array_equal(np.asarray(got), np.asarray(want)), f"{name} on rank {r}: {got!r} != {want!r}"
    checks.append(name)


def raises(name: str, call: Callable[[], Any], kind: type[Exception]) -> None:
    try:
        call()
    except kind:
        checks.append(name)
        return
    raise AssertionError(f"{name}: no {kind.__name__}")


def slices(dtype: tf.DType) -> tf.IndexedSlices:
    return tf.IndexedSlices(tf.cast(tf.ones([2, 3]), dtype), tf.constant([r, r + 1]))


(alone,) = hvd.grouped_allreduce([slices(tf.float32)])
check("grouped_sparse_alone", alone.values, np.full([4, 3], 0.5, np.float32))
check("grouped_sparse_indices", alone.indices, [0, 1, 1, 2])
mixed = hvd.grouped_allreduce([slices(tf.float32), tf.ones([2]) * (r + 1), slices(tf.int32)], op=hvd.Average)
check("grouped_mixed_dense", mixed[1], np.full([2], 1.5, np.float32))
check("grouped_mixed_int_average", mixed[2].values.dtype.name, "float64")
raises("sparse_min_refused", lambda: hvd.allreduce(slices(tf.float32), op=hvd.Min), NotImplementedError)
raises("sparse_prescale_refused", lambda: hvd.allreduce(slices(tf.float32), prescale_factor=0.5), NotImplementedError)
fp16 = hvd.allreduce(tf.constant([3.0], tf.float16), op=hvd.Sum, prescale_factor=0.3)
check("prescale_fp16_in_fp32", fp16, (np.float16(np.float32(3.0) * np.float32(0.3)) * 2).reshape(1))
ints = hvd.allreduce(tf.constant([7, -7]), op=hvd.Sum, postscale_factor=0.5)
check("postscale_int_in_fp64", ints, [7, -7])
(share,) = hvd.grouped_reducescatter(
    [tf.ones([4])], device_dense="", op=hvd.Average, process_set=hvd.global_process_set, prescale_factor=2.0,
    postscale_factor=0.5,
)  # fmt: skip
check("grouped_reducescatter_scaled", share, [1.0, 1.0])
received = hvd.alltoall(tf.constant([1, 2, 3, 4], tf.uint8))  # no splits: the rows alone, as Horovod's
check("alltoall_uint8", received, np.array([1, 2, 1, 2] if r == 0 else [3, 4, 3, 4], np.uint8))
_, splits = hvd.alltoall(tf.constant([1, 2, 3, 4], tf.uint8), splits=tf.constant([2, 2]))
check("alltoall_uint8_splits", splits, [2, 2])
check("alltoall_empty", hvd.alltoall(tf.zeros([0, 2])).shape, [0, 2])
check("alltoall_equal_splits", hvd.alltoall(tf.constant([1, 2], tf.int64), splits=tf.constant([1, 1]))[0], [r + 1] * 2)
raises("alltoall_uneven", lambda: hvd.alltoall(tf.ones([3])), tf.errors.InvalidArgumentError)
raises(
    "alltoall_int64_splits",
    lambda: hvd.alltoall(tf.ones([2]), splits=tf.constant([1, 1], tf.int64)),
    tf.errors.InvalidArgumentError,
)
check("executing_eagerly", hvd._executing_eagerly(), True)
first, second = tf.Variable([1.0 + r]), tf.Variable([2.0 + r])
hvd.broadcast_([first, second], root_rank=1)
check("broadcast_in_place", [first.numpy(), second.numpy()], [[2.0], [3.0]])
check("grouped_names", hvd.grouped_allgather([tf.ones([1])], name="g", ignore_name_scope=True)[0], [1.0, 1.0])
check("grouped_names_reduce", hvd.grouped_allreduce([tf.ones([1])], name="g", ignore_name_scope=True)[0], [1.0])
x = tf.Variable(tf.ones([2, 2]) * (r + 1))


def gradient(collective: Callable[[Any], Any]) -> Any:
    @tf.function
    def run() -> Any:
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(collective(x))
        return tape.gradient(y, x)

    return run()


twos, ones = np.full([2, 2], 2.0, np.float32), np.ones([2, 2], np.float32)
# Horovod's gradients: allgather's and broadcast's average the ranks' gradients (this rank's rows; the
# root's), reducescatter's gathers them, times the size for Sum.
check("grad_allgather", gradient(hvd.allgather), ones)
check("grad_grouped_allgather", gradient(lambda v: hvd.grouped_allgather([v])[0]), ones)
check("grad_broadcast", gradient(lambda v: hvd.broadcast(v, 0)), ones if r == 0 else ones * 0)
check("grad_reducescatter", gradient(lambda v: hvd.reducescatter(v, op=hvd.Sum)), twos)
check("grad_grouped_reducescatter", gradient(lambda v: hvd.grouped_reducescatter([v], op=hvd.Sum)[0]), twos)
check("grad_reducescatter_average", gradient(lambda v: hvd.reducescatter(v, op=hvd.Average)), ones)
# Horovod's grouped Average scales inside its op: integer tensors stay integer (2 and 4 average to 3).
averaged = hvd.grouped_allreduce([tf.constant([2 * (r + 1)], tf.int32), tf.constant([1.0])], op=hvd.Average)
check("grouped_average_int", averaged[0].numpy(), np.array([3], np.int32))
check("grouped_average_int_dtype", averaged[0].dtype.name, "int32")
mixed = [tf.IndexedSlices(tf.ones([1]), tf.constant([0])), tf.ones([1], tf.int32)]
# The op is checked for IndexedSlices before any tensor is reduced (int32 and Adasum would fail first).
raises("grouped_sparse_op_first", lambda: hvd.grouped_allreduce(mixed, op=hvd.Adasum), NotImplementedError)
# alltoall's gradient goes back where each row came from: with [1, 2] sent to [0, 1], ones come back.
check("grad_alltoall", gradient(lambda v: hvd.alltoall(v[:, 0]) * (r + 1)), [[1.0 + 0.0, 0.0], [2.0, 0.0]])
check("grad_grouped_allreduce", gradient(lambda v: hvd.grouped_allreduce([v])[0]), ones)
# Adasum of [1, 0, 2] and [0, 1, 2]: a.b = 4, |a|^2 = |b|^2 = 5, so 0.6 a + 0.6 b.
mine = tf.constant([1.0, 0.0, 2.0] if r == 0 else [0.0, 1.0, 2.0])
check("adasum", np.round(hvd.allreduce(mine, op=hvd.Adasum).numpy(), 5), np.array([0.6, 0.6, 2.4], np.float32))
v = tf.Variable([1.0, 1.0])
with tf.GradientTape() as tape:
    loss = v[r]  # orthogonal gradients: Adasum adds them ([1, 1]) where Average halves them
check("adasum_tape", hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [v])[0], [1.0, 1.0])
print("RESULT " + json.dumps({"rank": r, "checks": checks}), flush=True)
