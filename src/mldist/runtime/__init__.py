"""Inside a worker: ``init`` and the process context (worker), collectives and
gradient averaging, failure explanations (failures), private TensorFlow/Keras
accesses (compat), and one module per collective engine (tf_engine).

Example::

    from mldist import runtime
    ctx = runtime.init()
"""

from __future__ import annotations

from .collectives import allgather, allreduce, broadcast
from .gradients import DistributedGradientTape, average_gradients
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
    "strategy",
]
