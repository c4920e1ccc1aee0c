"""mldist: data-parallel TensorFlow/Keras from one CPU to many GPUs on HPC clusters.

``import mldist`` stays free of TensorFlow; ``mldist.keras``, ``mldist.data``
and ``mldist.preempt`` are imported on first access.

Example::

    import mldist
    ctx = mldist.init()
    print(ctx.rank, ctx.size)   # "0 1" for a plain process
"""

from __future__ import annotations

import importlib
from typing import Any

from .checkpoint import CheckpointManager
from .errors import CheckpointError, ConfigError, DetectionError, LaunchError, MldistError, RuntimeStateError
from .runtime import (
    Context,
    DistributedGradientTape,
    allgather,
    allreduce,
    broadcast,
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

#: Submodules reachable as attributes after a plain ``import mldist``, imported on first use.
_LAZY = ("keras", "data", "preempt")

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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mldist' has no attribute {name!r}")
