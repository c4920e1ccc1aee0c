"""``horovod.tensorflow.keras``'s path: the same API as ``mldist.horovod.keras``.

Example::

    import mldist.horovod.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))
"""

from __future__ import annotations

from typing import Any

from ...keras import *  # noqa: F403 - this path is an alias of mldist.horovod.keras
from ...keras import __all__ as _all

__all__ = list(_all)


def __getattr__(name: str) -> Any:
    from ... import attribute

    return attribute(name, __name__)
