"""Inside a worker, bottom to top: the process context (context), the one exit path
(leave), failure explanations (failures), the stalled-collective watch (stall), the
watch on the launcher (watchdog), the engines behind one interface (engine; mpi_engine and its
world in mpi_world, with mpi_exit, mpi_join and subsets, tf_engine, jax_engine),
``init`` (worker), collectives and gradient averaging, and the timelines of chosen
steps on every rank (profiling); private TensorFlow/Keras accesses live in compat.

Example::

    from mldist import runtime
    ctx = runtime.init()
"""

from __future__ import annotations

from .collectives import allgather, allreduce, broadcast
from .gradients import DistributedGradientTape, average_gradients
from .stall import stall_watch
from .worker import Context, context, current, init, is_chief, local_rank, local_size, rank, size, strategy

__all__ = [
    "Context",
    "DistributedGradientTape",
    "allgather",
    "allreduce",
    "average_gradients",
    "broadcast",
    "context",
    "current",
    "init",
    "is_chief",
    "local_rank",
    "local_size",
    "rank",
    "size",
    "stall_watch",
    "strategy",
]
