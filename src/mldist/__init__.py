"""mldist: data-parallel TensorFlow/Keras from one CPU to many GPUs on HPC clusters.

Example::

    import mldist
    ctx = mldist.init()
    print(ctx.rank, ctx.size)   # "0 1" for a plain process
"""

from __future__ import annotations

from .checkpoint import CheckpointManager
from .collectives import allgather, allreduce, broadcast
from .errors import CheckpointError, ConfigError, DetectionError, LaunchError, MldistError, RuntimeStateError
from .gradients import DistributedGradientTape
from .runtime import (
    Context,
    context,
    init,
    is_chief,
    local_rank,
    local_size,
    rank,
    size,
    strategy,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "Context",
    "DetectionError",
    "DistributedGradientTape",
    "LaunchError",
    "MldistError",
    "RuntimeStateError",
    "__version__",
    "allgather",
    "allreduce",
    "broadcast",
    "context",
    "init",
    "is_chief",
    "local_rank",
    "local_size",
    "rank",
    "size",
    "strategy",
]
