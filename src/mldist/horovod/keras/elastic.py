"""``horovod.keras.elastic``'s path (see :mod:`mldist.horovod.keras_elastic`)."""

from ..keras_elastic import *  # noqa: F403
from ..keras_elastic import __all__ as _all

__all__ = list(_all)
