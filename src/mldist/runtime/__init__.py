"""Inside a worker. Four rooms, bottom to top, each importing only the ones below it and the two
shared modules here (``context``: the process's settings and placement; ``compat``: private
TensorFlow/Keras accesses):

- :mod:`~mldist.runtime.watch`: who is late and where (the stalled-collective watch, its verdict
  and lines, the straggler tracker, the launcher watchdog, failure explanations, the one exit path);
- :mod:`~mldist.runtime.engines`: the engines behind one interface (MPI, TensorFlow collectives, JAX);
- :mod:`~mldist.runtime.start`: ``init`` and the start-up hook's work, and every process-wide change
  (``patches.PATCHES``);
- :mod:`~mldist.runtime.collect`: collectives, buckets, gradient averaging and step timelines.

``hook/`` is the ``sitecustomize`` a worker's Python starts with; it imports :mod:`~mldist.runtime.start`.

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
    from .collect.collectives import allgather, allreduce, broadcast
    from .collect.gradients import DistributedGradientTape, average_gradients
    from .start.worker import Context, context, current, init, is_chief, local_rank, local_size, rank, size, strategy
    from .watch.stall import stall_watch

#: Public name -> the module that defines it, imported on first use: ``import mldist`` stays a few modules
#: (each of 10,000 ranks reads every module it imports from the shared file system).
_WHERE = {
    "Context": "start.worker",
    "DistributedGradientTape": "collect.gradients",
    "allgather": "collect.collectives",
    "allreduce": "collect.collectives",
    "average_gradients": "collect.gradients",
    "broadcast": "collect.collectives",
    "context": "start.worker",
    "current": "start.worker",
    "init": "start.worker",
    "is_chief": "start.worker",
    "local_rank": "start.worker",
    "local_size": "start.worker",
    "rank": "start.worker",
    "size": "start.worker",
    "stall_watch": "watch.stall",
    "strategy": "start.worker",
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
