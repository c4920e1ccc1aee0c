"""Horovod's tensor collectives, with its names, arguments and defaults, on mldist's engines.

Every function works eagerly and inside ``tf.function``; reductions are
differentiable (the gradient of an all-reduce is the all-reduce of the
gradient, as in Horovod). ``name``, ``device_*`` and ``ignore_name_scope`` are
accepted and ignored: the engine places and names its own ops.

Example::

    import mldist.horovod as hvd
    hvd.init()
    total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
    rows = hvd.allgather(tf.fill([hvd.rank() + 1, 3], 1.0))   # 1 + 2 + ... rows
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import runtime
from ..errors import ConfigError, UnsupportedError
from ..runtime.engines import subsets
from ..runtime.engines.engine import running
from . import basics
from .basics import WIRE_OPS, Average, Sum, check_process_set, honours_process_set
from .compression import Compression
from .settings import fusion_bytes


def _tf() -> Any:
    import tensorflow as tf

    return tf


def resolve_op(op: int | None, average: bool | None) -> int:
    """Horovod's ``op``/``average`` pair as one op; Average when neither is given.

    Example:
        >>> resolve_op(None, False), resolve_op(None, None), resolve_op(4, None)
        (1, 0, 4)
    """
    if op is not None and average is not None:
        raise ConfigError("pass op= or the older average=, not both (op supersedes average)")
    if op is None:
        op = Sum if average is False else Average
    if op not in WIRE_OPS and op != basics.Adasum:
        raise ConfigError(f"op={op!r} is not one of hvd.Average, Sum, Adasum, Min, Max, Product")
    return op


def _scale(t: Any, factor: float) -> Any:
    """``t * factor`` as Horovod computes it: integers in float64, 16-bit floats in float32."""
    tf = _tf()
    if factor == 1.0:
        return t
    if t.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(t, tf.float32) * factor, t.dtype)
    if t.dtype.is_floating or t.dtype.is_complex:
        return t * tf.cast(factor, t.dtype)
    return tf.cast(tf.cast(t, tf.float64) * factor, t.dtype)


def _average(summed: Any, n: int) -> Any:
    """Divide by the world size as Horovod does: integers give float64 (true division)."""
    tf = _tf()
    if summed.dtype.is_floating or summed.dtype.is_complex:
        return summed / tf.cast(n, summed.dtype)
    return tf.math.truediv(summed, tf.cast(n, summed.dtype))


def reduce_dense(tensors: list[Any], op: int, prescale: float, postscale: float, compression: Any) -> list[Any]:
    """All-reduce dense tensors in one fused call, Horovod's way (scale, compress, reduce, restore)."""
    n = basics.set_size()
    if op == basics.Adasum:
        return [_scale(_adasum(_scale(t, prescale)), postscale) for t in tensors]
    sent, ctxs = [], []
    for t in tensors:
        c, ctx = compression.compress(_scale(t, prescale))
        sent.append(c)
        ctxs.append(ctx)
    reduced = runtime.allreduce(sent, WIRE_OPS[op], bucket_bytes=fusion_bytes()) if n > 1 else sent
    out = []
    for r, ctx in zip(reduced, ctxs, strict=True):
        r = compression.decompress(r, ctx)
        out.append(_scale(_average(r, n) if op == Average else r, postscale))
    return out


def _adasum(t: Any) -> Any:
    if not (t.dtype.is_floating):
        raise ConfigError(f"op=hvd.Adasum takes floating tensors, not {t.dtype.name}")
    from .adasum import adasum

    return adasum(t, basics.set_size()) if basics.set_size() > 1 else t


def _with_gradient(x: Any, y: Any, grad: Any) -> Any:
    """``y`` (already computed from ``x``) with ``grad`` as the gradient back to ``x``.

    The collective runs outside ``tf.custom_gradient``: under MultiWorkerMirroredStrategy a
    strategy call inside its eager decorator fails ("Mismatching tf.distribute.Strategy objects").
    """
    tf = _tf()
    subset = subsets.active()  # the gradient's collectives run over the same process set

    def in_set(dy: Any) -> Any:
        with subsets.within(subset):
            return grad(dy)

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def attach(x_: Any) -> Any:
        return tf.identity(y), in_set

    return attach(x)


def _differentiable(x: Any, op: int, prescale: float, postscale: float, compression: Any) -> Any:
    """A one-tensor all-reduce whose gradient is the same all-reduce (Sum and Average)."""
    y = reduce_dense([x], op, prescale, postscale, compression)[0]
    return _with_gradient(x, y, lambda dy: reduce_dense([dy], op, prescale, postscale, compression)[0])


def _sparse(slices: Any, op: int, prescale: float = 1.0, postscale: float = 1.0) -> Any:
    """IndexedSlices: gather every rank's values and indices (Horovod's sparse all-reduce)."""
    tf = _tf()
    if op not in (Average, Sum):
        raise UnsupportedError("IndexedSlices take op=hvd.Average or hvd.Sum; pass sparse_as_dense=True for others")
    if (prescale, postscale) != (1.0, 1.0):
        raise UnsupportedError("IndexedSlices take no prescale_factor or postscale_factor (as in Horovod)")
    values = allgather(slices.values)
    if op == Average:
        values = values / tf.cast(basics.set_size(), values.dtype)
    return tf.IndexedSlices(values, allgather(slices.indices), dense_shape=slices.dense_shape)


@honours_process_set
def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: Any = None,
    ignore_name_scope: bool = False,
) -> Any:
    """Reduce a tensor, variable or IndexedSlices across all ranks (default: the average).

    Args:
        tensor: the same shape on every rank.
        average: deprecated in Horovod; True is op=Average, False op=Sum.
        compression: Compression.none or Compression.fp16 (or a compressor of your own).
        op: hvd.Average, Sum, Min, Max or Product.
        prescale_factor, postscale_factor: multiply before and after the reduction.

    Example::

        mean = hvd.allreduce(tf.constant(float(hvd.rank())))
    """
    check_process_set(process_set)
    op = resolve_op(op, average)
    tf = _tf()
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse(tensor, op, prescale_factor, postscale_factor)
    t = tf.convert_to_tensor(tensor)
    if op in (Average, Sum) and (t.dtype.is_floating or t.dtype.is_complex):
        return _differentiable(t, op, prescale_factor, postscale_factor, compression)
    return reduce_dense([t], op, prescale_factor, postscale_factor, compression)[0]


@honours_process_set
def grouped_allreduce(
    tensors: list[Any],
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    name: str | None = None,
    ignore_name_scope: bool = False,
) -> list[Any]:
    """All-reduce a list of tensors in one fused collective; arguments as :func:`allreduce`.

    Floating tensors reduced with Average or Sum are differentiable (each gradient is
    all-reduced the same way). IndexedSlices are gathered, as :func:`allreduce` does.

    Example::

        grads = hvd.grouped_allreduce(grads)
    """
    check_process_set(process_set)
    op = resolve_op(op, average)
    tf = _tf()
    if op not in (Average, Sum) and any(isinstance(t, tf.IndexedSlices) for t in tensors):  # before any reduce
        raise UnsupportedError("IndexedSlices take op=hvd.Average or hvd.Sum; pass sparse_as_dense=True for others")
    dense = [tf.convert_to_tensor(t) for t in tensors if not isinstance(t, tf.IndexedSlices)]
    reduced = iter(reduce_dense(dense, op, prescale_factor, postscale_factor, compression) if dense else [])
    out = []
    for t in tensors:
        if isinstance(t, tf.IndexedSlices):
            out.append(_sparse(t, op, prescale_factor, postscale_factor))
            continue
        x, y = tf.convert_to_tensor(t), next(reduced)
        if y.dtype != x.dtype:  # Horovod's grouped Average scales in its op: integers stay integers
            y = tf.cast(y, x.dtype)
        if op in (Average, Sum) and (x.dtype.is_floating or x.dtype.is_complex):
            y = _with_gradient(
                x, y, lambda dy: reduce_dense([dy], op, prescale_factor, postscale_factor, compression)[0]
            )
        out.append(y)
    return out


@honours_process_set
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = None) -> Any:
    """Concatenate every rank's tensor on the first axis, in rank order (its length may differ per rank).

    Example::

        everyone = hvd.allgather(tf.constant([[hvd.rank()]]))   # shape [size, 1]
    """
    check_process_set(process_set)
    basics.context()
    tf = _tf()
    t = tf.convert_to_tensor(tensor)
    gathered = runtime.allgather(t)
    if not (t.dtype.is_floating or t.dtype.is_complex):
        return gathered

    def grad(dy: Any) -> Any:  # Horovod's: this rank's rows of the average of every rank's gradient
        rows = runtime.allgather(tf.shape(t)[:1])
        start = tf.reduce_sum(rows[: basics.set_rank()])
        averaged = reduce_dense([dy], Average, 1.0, 1.0, Compression.none)[0]
        return averaged[start : start + tf.shape(t)[0]]

    return _with_gradient(t, gathered, grad)


@honours_process_set
def grouped_allgather(
    tensors: list[Any], name: str | None = None, ignore_name_scope: bool = False, process_set: Any = None
) -> list[Any]:
    """:func:`allgather` of each tensor in a list."""
    return [allgather(t, process_set=process_set) for t in tensors]


@honours_process_set
def broadcast(
    tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = None
) -> Any:
    """``root_rank``'s value of ``tensor`` on every rank; the gradient flows back to the root.

    Example::

        w = hvd.broadcast(w, root_rank=0)
    """
    check_process_set(process_set)
    basics.context()
    tf = _tf()
    t = tf.convert_to_tensor(tensor)
    received = runtime.broadcast(t, root=root_in_set(root_rank))
    if not (t.dtype.is_floating or t.dtype.is_complex):
        return received

    def grad(dy: Any) -> Any:  # Horovod's: the average of every rank's gradient, on the root only
        averaged = reduce_dense([dy], Average, 1.0, 1.0, Compression.none)[0]
        # "* 0", not zeros_like: in a TF1 graph that folds to a constant and drops the all-reduce on
        # the other ranks, which the root then waits for.
        return averaged if basics.rank() == root_rank else averaged * 0

    return _with_gradient(t, received, grad)


def root_in_set(root_rank: int) -> int:
    """A world rank's place in the process set collectives run over now (the rank itself outside one)."""
    subset = subsets.active()
    if subset is None:
        return root_rank
    if root_rank not in subset.ranks:
        raise ConfigError(f"root_rank={root_rank} is not in the process set {list(subset.ranks)}")
    return subset.index(root_rank)


@honours_process_set
def barrier(process_set: Any = None) -> None:
    """Return once every rank has called it."""
    check_process_set(process_set)
    basics.context()
    runtime.allreduce(_tf().zeros([1], _tf().int32), "sum")


def join(device: str = "") -> Any:
    """Wait until every rank has joined; the rank that joined last (an int32 tensor).

    On the MPI engine, as in Horovod: a rank that ran out of data joins and, until every
    rank has, answers the others' all-reduces with zeros (an average still divides by the
    world size); a broadcast or allgather on the others fails meanwhile. On RING/NCCL
    ``join`` is a collective: call it at the same point on every rank.
    """
    basics.context()
    tf = _tf()
    if (eng := running()).joins:
        if tf.executing_eagerly():
            return tf.constant(eng.join(), tf.int32)
        last = tf.numpy_function(lambda: np.int32(eng.join()), [], tf.int32, stateful=True)
        return tf.reshape(last, [])
    stamp = tf.constant([[time.time(), float(basics.rank())]], tf.float64)
    stamps = runtime.allgather(stamp)
    return tf.cast(stamps[tf.argmax(stamps[:, 0]), 1], tf.int32)


def size_op(process_set_id: int = 0, name: str | None = None) -> Any:
    """The number of ranks (of that process set) as an int32 tensor."""
    from .process_sets import registered

    return _tf().constant(registered(process_set_id).size(), _tf().int32)


def local_size_op(name: str | None = None) -> Any:
    """The number of ranks on this node as an int32 tensor."""
    return _tf().constant(basics.local_size(), _tf().int32)


def rank_op(name: str | None = None) -> Any:
    """This rank as an int32 tensor."""
    return _tf().constant(basics.rank(), _tf().int32)


def local_rank_op(name: str | None = None) -> Any:
    """This rank on its node as an int32 tensor."""
    return _tf().constant(basics.local_rank(), _tf().int32)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> Any:
    """1 (int32) if this rank is in that process set, else 0."""
    from .process_sets import registered

    return _tf().constant(int(registered(process_set_id).included()), _tf().int32)
