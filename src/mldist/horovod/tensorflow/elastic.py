"""``horovod.tensorflow.elastic``'s path (see :mod:`mldist.horovod.elastic`)."""

from ..elastic import *  # noqa: F403
from ..elastic import __all__ as _all

__all__ = list(_all)
