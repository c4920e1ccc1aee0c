"""Horovod's Keras API (``horovod.keras`` and ``horovod.tensorflow.keras``) on mldist.

The same names as ``mldist.horovod`` plus the Keras ``DistributedOptimizer``,
``load_model``, ``broadcast_global_variables`` and ``callbacks``; ``allreduce``,
``allgather`` and ``broadcast`` take numbers, arrays or tensors. The Keras is
tf_keras under ``TF_USE_LEGACY_KERAS=1``, else Keras 3 (TensorFlow's rule).

Example::

    import mldist.horovod.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(ds, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""

from __future__ import annotations

from typing import Any

from .. import ops as _ops
from .. import scatter as _scatter
from ..basics import (
    Adasum,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from ..compression import Compression
from ..objects import allgather_object, broadcast_global_variables, broadcast_object, broadcast_object_fn
from ..ops import join
from ..optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model
from ..process_sets import add_process_set, init, remove_process_set
from ..settings import start_timeline, stop_timeline
from . import callbacks

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]


def _tensor(value: Any) -> Any:
    import tensorflow as tf

    return tf.convert_to_tensor(value)


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: int | None = None,
    compression: Any = Compression.none,
) -> Any:
    """All-reduce a number, array or tensor (default: the average); a tensor back."""
    return _ops.allreduce(
        _tensor(value),
        average=average,
        compression=compression,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )


def allgather(value: Any, name: str | None = None) -> Any:
    """Every rank's array or tensor concatenated on the first axis."""
    return _ops.allgather(_tensor(value))


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """``root_rank``'s array or tensor on every rank."""
    return _ops.broadcast(_tensor(value), root_rank)


def reducescatter(value: Any, name: str | None = None, op: int = Average) -> Any:
    """Reduce over ranks and keep this rank's share of the rows."""
    return _scatter.reducescatter(_tensor(value), op=op)


def __getattr__(name: str) -> Any:
    from .. import attribute

    return attribute(name, __name__)
