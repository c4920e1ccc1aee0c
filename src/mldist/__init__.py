"""mldist: data-parallel TensorFlow/Keras from one CPU to many GPUs on HPC clusters.

``import mldist`` stays free of TensorFlow and loads a handful of modules; the runtime's names,
``mldist.keras``, ``mldist.data`` and ``mldist.preempt`` are imported on first access.

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
from .errors import CheckpointError, ConfigError, DetectionError, LaunchError, MldistError, RuntimeStateError

#: Never true: the imports below are for readers of the source (the API reference, mypy); at run time
#: :func:`__getattr__` imports each name on first use (``if TYPE_CHECKING`` would hide them from the reference).
_READ_ONLY = False
if _READ_ONLY:
    from .checkpoint import CheckpointManager
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
    """The runtime's public names, ``CheckpointManager`` and the submodules, each imported on first use:
    ``import mldist`` loads a few modules, the rest come with what the script calls."""
    if name in _runtime.__all__:
        # From the defining module, not the package: once anything imported the submodule
        # mldist.runtime.context, the package's attribute ``context`` is that module, not the function.
        value = getattr(importlib.import_module(f"{_runtime.__name__}.{_runtime._WHERE[name]}"), name)
    elif name == "CheckpointManager":
        from .checkpoint import CheckpointManager as value
    else:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module 'mldist' has no attribute {name!r}")
    globals()[name] = value
    return value
