"""``horovod.tensorflow.mpi_ops``' path: the collectives and process queries of :mod:`mldist.horovod`.

``_allreduce`` is Horovod's low-level sum (no averaging, no compression).

Example::

    from mldist.horovod.tensorflow.mpi_ops import _allreduce, Sum
    total = _allreduce(tf.ones([2]))
"""

from __future__ import annotations

from typing import Any

from .. import *  # noqa: F403 - the process queries and collectives of mldist.horovod
from .. import __all__ as _all
from ..basics import Sum, global_process_set
from ..ops import allreduce


def _allreduce(
    tensor: Any,
    name: str | None = None,
    op: int = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> Any:
    """Horovod's low-level all-reduce: ``op`` (default Sum) of ``tensor`` over the ranks."""
    return allreduce(
        tensor, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set=process_set
    )


__all__ = [*_all, "_allreduce"]
