"""Horovod's scattering collectives: ``alltoall``, ``reducescatter``, ``grouped_reducescatter``.

Example::

    mine = hvd.reducescatter(tf.ones([4, 2]), op=hvd.Sum)   # [2, 2] of 2.0 on 2 ranks
"""

from __future__ import annotations

from typing import Any

from .. import runtime
from ..errors import UnsupportedError
from ..runtime.watch.failures import invalid_argument
from . import basics
from .basics import Average, Sum, check_process_set, honours_process_set
from .compression import Compression
from .ops import _scale, _tf, _with_gradient, allgather, reduce_dense


def _even_splits(rows: Any, n: int) -> Any:
    """Rows per rank when they are spread evenly, lower ranks taking one more."""
    tf = _tf()
    base, extra = rows // n, rows % n
    return base + tf.cast(tf.range(n) < extra, rows.dtype)


@honours_process_set
def alltoall(
    tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = None
) -> tuple[Any, Any]:
    """Send ``splits[r]`` rows of ``tensor`` to rank ``r``; the rows received, and with ``splits`` also how
    many came from each rank (as Horovod's: without ``splits``, the rows alone).

    Args:
        tensor: rank >= 1; its rows are sent in order, first ``splits[0]`` to rank 0 and so on.
        splits: rows per destination (sums to the first dimension); default: equal shares.

    The gradient sends each rank's gradient rows back where they came from (Horovod's).

    Example::

        received, counts = hvd.alltoall(tf.range(hvd.size() * 2), splits=[2] * hvd.size())
        mine = hvd.alltoall(tf.range(hvd.size() * 2))
    """
    given = splits is not None
    check_process_set(process_set)
    n, me = basics.set_size(), basics.set_rank()
    tf = _tf()
    t = tf.convert_to_tensor(tensor)
    if t.shape.rank in (None, 0):
        raise invalid_argument(f"alltoall needs a tensor of rank >= 1, got shape {t.shape}")
    rows = tf.shape(t, out_type=tf.int32)[0]
    if splits is None:
        if t.shape[0] is not None and t.shape[0] % n:
            raise invalid_argument(f"alltoall: {t.shape[0]} rows do not split evenly over {n} ranks; pass splits=")
        splits = tf.fill([n], rows // n)
    splits = tf.convert_to_tensor(splits)
    if splits.dtype != tf.int32:  # as Horovod: splits are 32-bit integers
        raise invalid_argument(f"alltoall: splits must be int32, not {splits.dtype.name}")
    splits = tf.reshape(splits, [-1])
    if splits.shape[0] is not None and splits.shape[0] != n:
        raise invalid_argument(f"alltoall: splits has {splits.shape[0]} entries; it needs one per rank ({n})")
    tf.debugging.assert_equal(tf.reduce_sum(splits), rows, message="alltoall: splits must sum to the rows sent")
    table = tf.reshape(runtime.allgather(splits[tf.newaxis]), [n, n])  # table[src, dst]
    everything = runtime.allgather(t)
    block_start = tf.concat([[0], tf.cumsum(tf.reduce_sum(table, axis=1))[:-1]], 0)
    starts = block_start + tf.reduce_sum(table[:, :me], axis=1)
    received = table[:, me]
    index = tf.ragged.range(starts, starts + received).flat_values
    out = tf.gather(everything, index)
    if t.dtype.is_floating or t.dtype.is_complex:
        out = _with_gradient(t, out, lambda dy: alltoall(dy, splits=received, process_set=process_set)[0])
    return (out, received) if given else out


@honours_process_set
def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: int = Average,
    name: str | None = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Reduce ``tensor`` over ranks, then keep this rank's share of the rows (lower ranks get one more).

    Example::

        mine = hvd.reducescatter(tf.ones([4, 2]), op=hvd.Sum)   # [2, 2] of 2.0 on 2 ranks
    """
    check_process_set(process_set)
    if op not in (Average, Sum):
        raise UnsupportedError("reducescatter takes op=hvd.Average or hvd.Sum (as Horovod's)")
    tf = _tf()
    t = tf.convert_to_tensor(tensor)
    if t.shape.rank in (None, 0):
        raise invalid_argument(f"reducescatter needs a tensor of rank >= 1, got shape {t.shape}")
    full = reduce_dense([t], op, prescale_factor, postscale_factor, compression)[0]
    n, me = basics.set_size(), basics.set_rank()
    shares = _even_splits(tf.shape(t)[0], n)
    start = tf.reduce_sum(shares[:me])
    mine = full[start : start + shares[me]]
    if not (t.dtype.is_floating or t.dtype.is_complex):
        return mine

    def grad(dy: Any) -> Any:
        # Horovod's: every rank's share came from every rank's tensor; the gradients are gathered, and
        # with Sum scaled by the set's size (its tests expect size x ones for Sum, ones for Average).
        whole = _scale(allgather(dy), prescale_factor * postscale_factor)
        return _scale(whole, float(n)) if op == Sum else whole

    return _with_gradient(t, mine, grad)


@honours_process_set
def grouped_reducescatter(
    tensors: list[Any],
    device_dense: str = "",
    compression: Any = Compression.none,
    op: int = Average,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """:func:`reducescatter` of each tensor in a list; arguments as there."""
    return [
        reducescatter(
            t,
            compression=compression,
            op=op,
            process_set=process_set,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
        )
        for t in tensors
    ]
