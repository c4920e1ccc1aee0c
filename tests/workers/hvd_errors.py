"""Horovod's error cases on 2 ranks, caught as Horovod's tests catch them, then the ranks go on.

Shapes, dtypes, broadcast roots and allgather dtypes that differ across ranks raise
``tf.errors.FailedPreconditionError`` on every rank in eager calls (``InvalidArgumentError``
inside a ``tf.function``), with mldist's one line as the text. Prints RESULT {rank, caught, after}.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import tensorflow as tf

import mldist.horovod as hvd

hvd.init()
r = hvd.rank()
caught: list[str] = []


def expect(name: str, call: Callable[[], Any], kind: type[Exception] = tf.errors.FailedPreconditionError) -> None:
    try:
        call()
    except kind as exc:
        assert "workers passed tensors of different shapes or dtypes" in str(exc), str(exc)
        assert "rank 0:" in str(exc) and "rank 1:" in str(exc), str(exc)
        caught.append(name)
    else:
        raise SystemExit(f"{name}: no error on rank {r}")


expect("shape", lambda: hvd.allreduce(tf.ones([3 + r])))
expect("dtype", lambda: hvd.allreduce(tf.ones([3], tf.float32 if r == 0 else tf.float64)))
expect("root", lambda: hvd.broadcast(tf.ones([2]), root_rank=r))
expect("allgather", lambda: hvd.allgather(tf.ones([1, 2], tf.float32 if r == 0 else tf.int32)))
expect("grouped", lambda: hvd.grouped_allreduce([tf.ones([2]), tf.ones([1 + r])]))
expect("graph", lambda: tf.function(lambda: hvd.allreduce(tf.ones([3 + r])))(), tf.errors.InvalidArgumentError)
after = hvd.allreduce(tf.constant([1.0 + r]), op=hvd.Sum).numpy().tolist()  # the ranks go on together
print("RESULT " + json.dumps({"rank": r, "caught": caught, "after": after}), flush=True)
