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

from . import runtime as _runtime
from ._version import __version__
from .checkpoint import CheckpointManager
from .errors import CheckpointError, ConfigError, DetectionError, LaunchError, MldistError, RuntimeStateError
from .runtime import *  # noqa: F403 - the facade re-exports the runtime's public names

#: Submodules reachable as attributes after a plain ``import mldist``, imported on first use.
_LAZY = ("keras", "data", "preempt", "horovod")

__all__ = [
    *_runtime.__all__,
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "DetectionError",
    "LaunchError",
    "MldistError",
    "RuntimeStateError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mldist' has no attribute {name!r}")
