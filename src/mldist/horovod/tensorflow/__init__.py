"""``horovod.tensorflow``'s path: the same API as ``mldist.horovod``.

Example::

    import mldist.horovod.tensorflow as hvd
    hvd.init()
"""

from __future__ import annotations

from typing import Any

from .. import *  # noqa: F403 - this path is an alias of mldist.horovod
from .. import __all__ as _all
from ..util import _executing_eagerly as _executing_eagerly  # Horovod's own tests and scripts call it

__all__ = list(_all)


def __getattr__(name: str) -> Any:
    from .. import attribute

    return attribute(name, __name__)
