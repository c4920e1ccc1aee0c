"""Python objects through mldist's runtime: pickled into uint8 tensors, gathered from every rank.

The one gather both ``hvd.init`` (node discovery, before Horovod's own state is
ready) and ``hvd.allgather_object`` use; it reads nothing of Horovod's state,
which is why it lives below :mod:`mldist.horovod.basics`.

Example::

    hosts = gather_objects(socket.gethostname())   # every rank's host name, in rank order
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from .. import runtime


def pickler() -> Any:
    """cloudpickle when installed (lambdas and local functions work, as in Horovod), else pickle.

    Example::

        data = pickler().dumps(lambda x: x + 1)
    """
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return pickle


def bytes_tensor(data: bytes) -> Any:
    """``data`` as a uint8 tensor (imports TensorFlow).

    Args:
        data: the bytes to send.

    Example::

        bytes_tensor(b"abc").shape   # TensorShape([3])
    """
    import numpy as np
    import tensorflow as tf

    return tf.constant(np.frombuffer(data, np.uint8))


def evaluate(build: Callable[[], Any]) -> Any:
    """The numpy value of the tensor ``build()`` makes: eagerly, or (TensorFlow 1 graph mode) in a
    graph and session of its own, so the user's graph gains no ops and runs none of its own.

    Example::

        evaluate(lambda: runtime.allgather(tf.constant([1])))   # array([1, 1]) on 2 ranks
    """
    import tensorflow as tf

    if tf.executing_eagerly():
        return build().numpy()
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        return session.run(build())


def gather_objects(obj: Any) -> list[Any]:
    """``hvd.allgather_object`` on mldist's runtime alone (``hvd.init`` uses it before it has finished).

    Args:
        obj: this rank's object (picklable; call it on every rank).

    Example::

        gather_objects({"rank": runtime.context().rank})   # [{'rank': 0}, {'rank': 1}, ...]
    """
    from ..runtime.collect.collectives import world

    if world()[0] == 1:  # one rank (or a process set of one)
        return [obj]
    import tensorflow as tf

    data = pickler().dumps(obj)
    lengths = evaluate(lambda: runtime.allgather(tf.constant([len(data)], tf.int64)))
    gathered = evaluate(lambda: runtime.allgather(bytes_tensor(data))).tobytes()
    out, start = [], 0
    for n in lengths:
        out.append(pickle.loads(gathered[start : start + int(n)]))
        start += int(n)
    return out
