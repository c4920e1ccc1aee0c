"""Horovod's TensorFlow API (``horovod.tensorflow``) on mldist's engines, for Keras 3 and tf_keras.

Change one line of a Horovod script: ``import horovod.tensorflow as hvd``
becomes ``import mldist.horovod as hvd`` (``horovod.tensorflow.keras`` becomes
``mldist.horovod.tensorflow.keras``, ``horovod.keras`` ``mldist.horovod.keras``),
or run it unchanged with ``python -m mldist.horovod.alias train.py``. What
mldist does not provide (process sets, elastic mode, ...) raises
``UnsupportedError`` naming what to use instead.

Example::

    import mldist.horovod as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from .basics import (
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
from .compression import Compression
from .objects import (
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from .ops import (
    allgather,
    allreduce,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from .process_sets import add_process_set, init, remove_process_set
from .scatter import alltoall, grouped_reducescatter, reducescatter
from .settings import start_timeline, stop_timeline
from .tape import DistributedGradientTape, PartialDistributedGradientTape
from .util import _executing_eagerly as _executing_eagerly  # Horovod scripts call hvd._executing_eagerly()

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "Max",
    "Min",
    "PartialDistributedGradientTape",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
]

#: Horovod names mldist deliberately does not provide, with what to use instead.
REFUSED = {
    "data": "Horovod's tf.data compute service is not provided; shard input with mldist.data.shard",
    "BroadcastGlobalVariablesHook": "TensorFlow 1 session hooks are not supported; call hvd.broadcast_variables",
    "check_installed_version": "mldist is not Horovod; use mldist.__version__",
}


#: Names whose module imports Keras (or the launcher): loaded on first use.
LAZY = {
    "SyncBatchNormalization": "sync_batch_norm",
    "run": "runner",
    # Keras: `python -m mldist.horovod.alias --help` imports this package first, and answers at once.
    "DistributedOptimizer": "optimizer",
    "PartialDistributedOptimizer": "optimizer",
}


def attribute(name: str, module: str) -> Any:
    """A module's ``__getattr__``: a :data:`LAZY` name, or the refusal of :func:`refused`."""
    import importlib

    if name in LAZY:
        return getattr(importlib.import_module(f"{__name__}.{LAZY[name]}"), name)
    if name == "elastic":  # hvd.elastic without importing it first, as Horovod's modules allow
        return importlib.import_module(f"{module}.elastic")
    raise refused(name, module)


class RefusedName(UnsupportedError, AttributeError):
    """A Horovod name mldist refuses: a NotImplementedError that ``hasattr`` (and pytest) read as absent."""


class RefusedModule(UnsupportedError, ModuleNotFoundError):
    """A Horovod module mldist lacks (``horovod.torch`` through the alias): ``except ImportError`` takes it too.

    Its ``name`` stays None: ``from horovod import torch`` would otherwise swallow it into "cannot import name".
    """


def refused(name: str, module: str) -> Exception:
    """The error for ``module.name``: a clear refusal for known Horovod names, else AttributeError."""
    if name in REFUSED:
        return RefusedName(f"hvd.{name}: {REFUSED[name]} (mldist.horovod)")
    return AttributeError(f"module {module!r} has no attribute {name!r}")


#: Horovod's subpackages, reachable as attributes as in Horovod (``hvd.tensorflow``, ...).
_SUBPACKAGES = ("tensorflow", "keras", "common")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    return attribute(name, __name__)
