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

import importlib
from typing import Any

#: Never true: the imports below are for readers of the source (the API reference, mypy); at run time
#: :func:`__getattr__` imports each name on first use (``if TYPE_CHECKING`` would hide them from the reference).
_READ_ONLY = False
if _READ_ONLY:
    from .collectives import allgather, allreduce, broadcast
    from .gradients import DistributedGradientTape, average_gradients
    from .stall import stall_watch
    from .worker import Context, context, current, init, is_chief, local_rank, local_size, rank, size, strategy

#: Public name -> the module that defines it, imported on first use: ``import mldist`` stays a few modules
#: (each of 10,000 ranks reads every module it imports from the shared file system).
_WHERE = {
    "Context": "worker",
    "DistributedGradientTape": "gradients",
    "allgather": "collectives",
    "allreduce": "collectives",
    "average_gradients": "gradients",
    "broadcast": "collectives",
    "context": "worker",
    "current": "worker",
    "init": "worker",
    "is_chief": "worker",
    "local_rank": "worker",
    "local_size": "worker",
    "rank": "worker",
    "size": "worker",
    "stall_watch": "stall",
    "strategy": "worker",
}

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


def __getattr__(name: str) -> Any:
    """A public name (from its module, :data:`_WHERE`) or a submodule, imported on first use."""
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
