"""Horovod's variable and Python-object helpers: broadcast_variables, broadcast_object, allgather_object.

Objects travel pickled (cloudpickle when installed, so lambdas and local
functions work as in Horovod) as uint8 tensors through the engine
(:mod:`mldist.horovod.pickled`).

Example::

    hvd.broadcast_variables(model.variables, root_rank=0)
    config = hvd.broadcast_object(config if hvd.rank() == 0 else None)
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from .. import runtime
from ..errors import ConfigError, UnsupportedError
from . import basics
from .basics import check_process_set, honours_process_set
from .ops import root_in_set
from .pickled import bytes_tensor, evaluate, gather_objects, pickler


def _check_root(root_rank: int) -> None:
    n = basics.size()
    if not (isinstance(root_rank, int) and 0 <= root_rank < n):
        raise ConfigError(f"root_rank={root_rank!r} is not a rank of this world of {n}")
    root_in_set(root_rank)  # and in the process set collectives run over now


@honours_process_set
def broadcast_variables(variables: Any, root_rank: int, process_set: Any = None, inplace: bool = False) -> Any:
    """Assign ``root_rank``'s values to every variable on every rank (Keras 3 and tf_keras variables).

    Args:
        variables: a list of variables (model.variables, optimizer.variables).
        root_rank: the rank whose values win.

    Example::

        hvd.broadcast_variables(model.variables, root_rank=0)
    """
    check_process_set(process_set)
    _check_root(root_rank)
    import tensorflow as tf

    variables = list(variables)
    if not variables or basics.set_size() == 1:
        return tf.group()
    values = runtime.broadcast([tf.convert_to_tensor(v) for v in variables], root=root_in_set(root_rank))
    return tf.group(*[v.assign(x) for v, x in zip(variables, values, strict=True)])


def broadcast_(variables: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Any:
    """In-place broadcast (Horovod's ``broadcast_``): the variables, now holding root's values.

    In a TF1 graph nothing runs until evaluated: there the result is one tensor per variable whose
    evaluation broadcasts, then reads the variable (as Horovod's op output shares its buffer).
    """
    import tensorflow as tf

    variables = list(variables)
    done = broadcast_variables(variables, root_rank, process_set)
    if tf.executing_eagerly():
        return variables
    with tf.control_dependencies([done]):
        return [tf.identity(v) for v in variables]


def broadcast_global_variables(root_rank: int) -> Any:
    """In a TF1 graph: the op that broadcasts every global variable from ``root_rank``. Eagerly there
    is no such collection: refused (a ``RuntimeError``, as Horovod's), naming what to call instead."""
    import tensorflow as tf

    if tf.executing_eagerly():
        raise UnsupportedError(
            "hvd.broadcast_global_variables() needs TensorFlow 1 graph collections; "
            "use hvd.broadcast_variables(model.variables, root_rank) (and the optimizer's variables)"
        )
    variables = tf.compat.v1.global_variables()
    return broadcast_variables(variables, root_rank) if variables else tf.group()


@honours_process_set
def broadcast_object(
    obj: Any = None, root_rank: int = 0, session: Any = None, name: str | None = None, process_set: Any = None
) -> Any:
    """``root_rank``'s Python object on every rank (pickled; call it on every rank).

    Example::

        epoch = hvd.broadcast_object(start_epoch, root_rank=0)
    """
    check_process_set(process_set)
    _check_root(root_rank)
    if basics.set_size() == 1:
        return obj
    import tensorflow as tf

    me, root = basics.rank(), root_in_set(root_rank)
    data = pickler().dumps(obj) if me == root_rank else b""
    length = int(evaluate(lambda: runtime.broadcast(tf.constant([len(data)], tf.int64), root=root))[0])

    def payload() -> Any:
        return bytes_tensor(data) if me == root_rank else tf.zeros([length], tf.uint8)

    received = evaluate(lambda: runtime.broadcast(payload(), root=root))
    return obj if me == root_rank else pickle.loads(received.tobytes())


def broadcast_object_fn(
    root_rank: int = 0, session: Any = None, name: str | None = None, process_set: Any = None
) -> Callable[[Any], Any]:
    """A function ``f(obj)`` that returns ``root_rank``'s ``obj`` on every rank."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


@honours_process_set
def allgather_object(obj: Any, session: Any = None, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's Python object, in rank order (pickled; call it on every rank).

    Example::

        hosts = hvd.allgather_object(socket.gethostname())
    """
    check_process_set(process_set)
    basics.context()
    return gather_objects(obj)
