"""In-graph collectives on the runtime that ``mldist.init()`` started.

Tensors are fused into buckets: one collective per dtype per bucket. With
one worker every function is an identity and adds no collective op. In eager
code the collective runs through a cached ``tf.function`` (MWMS is slow
eagerly); inside a ``tf.function`` it is traced in place.

Example::

    import mldist, tensorflow as tf
    mldist.init()
    grads = mldist.allreduce([tf.ones([3]), tf.zeros([2, 2])], op="mean")
    weights = mldist.broadcast(weights, root=0)
    everyone = mldist.allgather(tf.constant([mldist.rank()]))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import context as runtime
from . import tf_engine

#: Default bucket size: large enough that a typical CNN needs one collective.
DEFAULT_BUCKET_BYTES = 64 * 1024 * 1024
OPS = ("mean", "sum", "max", "min")
COMPRESSIONS = (None, "fp16")


@dataclass(frozen=True)
class Bucket:
    """Indices (into the flat tensor list) fused into one collective."""

    dtype: str
    indices: tuple[int, ...]


def plan_buckets(items: Sequence[tuple[str, int]], bucket_bytes: int) -> list[Bucket]:
    """Group tensors by dtype, then into buckets of at most ``bucket_bytes``.

    A tensor larger than a bucket gets a bucket of its own. Order within a
    dtype is kept, so every rank builds the same buckets.

    Args:
        items: ``(dtype name, size in bytes)`` per tensor.
        bucket_bytes: bucket capacity.

    Example:
        >>> [b.indices for b in plan_buckets([("float32", 8), ("int32", 4), ("float32", 8)], 16)]
        [(0, 2), (1,)]
        >>> [b.indices for b in plan_buckets([("float32", 8)] * 3, 10)]
        [(0,), (1,), (2,)]
    """
    if bucket_bytes < 1:
        raise ConfigError(f"bucket_bytes={bucket_bytes} must be positive")
    order: dict[str, list[list[int]]] = {}
    fill: dict[str, int] = {}
    for i, (dtype, nbytes) in enumerate(items):
        buckets = order.setdefault(dtype, [[]])
        if buckets[-1] and fill[dtype] + nbytes > bucket_bytes:
            buckets.append([])
            fill[dtype] = 0
        buckets[-1].append(i)
        fill[dtype] = fill.get(dtype, 0) + nbytes
    return [Bucket(d, tuple(b)) for d, bs in order.items() for b in bs]


def _tf() -> Any:
    import tensorflow as tf

    return tf


def check_compression(compression: str | None) -> None:
    """Raise ConfigError unless ``compression`` is one of :data:`COMPRESSIONS`.

    Example:
        >>> check_compression("fp16")
    """
    if compression not in COMPRESSIONS:
        raise ConfigError(f"compression={compression!r}: use None or 'fp16'")


def _check(op: str, compression: str | None) -> None:
    if op not in OPS:
        raise ConfigError(f"op={op!r} is not one of {', '.join(OPS)}")
    check_compression(compression)


def _sum_tensors(tensors: list[Any]) -> list[Any]:
    """One SUM collective per tensor of ``tensors`` (already fused), on this run's engine."""
    return tf_engine.sum_buffers(runtime.strategy(), tensors)


def _gather_tensor(tensor: Any) -> Any:
    return tf_engine.gather(runtime.strategy(), tensor)


def _fused_sum(flat: list[Any], bucket_bytes: int, compression: str | None, prescale: float) -> list[Any]:
    tf = _tf()
    items = [(t.dtype.name, t.shape.num_elements() * t.dtype.size) for t in flat]
    out: list[Any] = [None] * len(flat)
    fused: list[Any] = []
    buckets = plan_buckets(items, bucket_bytes)
    for bucket in buckets:
        parts = [tf.reshape(flat[i], [-1]) for i in bucket.indices]
        buf = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
        if prescale != 1.0:
            buf = buf * tf.cast(prescale, buf.dtype)
        if compression == "fp16" and buf.dtype in (tf.float32, tf.float64):
            buf = tf.cast(buf, tf.float16)
        fused.append(buf)
    reduced = _sum_tensors(fused)
    for bucket, buf in zip(buckets, reduced, strict=True):
        buf = tf.cast(buf, flat[bucket.indices[0]].dtype)
        sizes = [flat[i].shape.num_elements() for i in bucket.indices]
        pieces = tf.split(buf, sizes) if len(sizes) > 1 else [buf]
        for i, piece in zip(bucket.indices, pieces, strict=True):
            out[i] = tf.reshape(piece, flat[i].shape)
    return out


def _as_tensors(tensors: Any) -> tuple[Any, list[Any]]:
    tf = _tf()
    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tensors)]
    for t in flat:
        if not t.shape.is_fully_defined():
            raise ConfigError(f"shape {t.shape} has unknown dimensions; collectives need fixed shapes")
    return tensors, flat


_FUNCTIONS: dict[tuple[Any, ...], Any] = {}


def _in_graph(key: tuple[Any, ...], fn: Any, *args: Any) -> Any:
    """Run ``fn`` traced: MWMS collectives are slow and noisy in eager mode.

    ``key`` names everything ``fn`` closes over, so one ``tf.function`` per
    key serves all eager calls (it retraces only for new shapes).
    """
    tf = _tf()
    if not tf.executing_eagerly():
        return fn(*args)
    if key not in _FUNCTIONS:
        _FUNCTIONS[key] = tf.function(fn)
    return _FUNCTIONS[key](*args)


def allreduce(
    tensors: Any,
    op: str = "mean",
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    compression: str | None = None,
) -> Any:
    """Reduce a tensor or a nested structure of tensors across all workers.

    Args:
        tensors: a tensor, or a list/tuple/dict of them.
        op: "mean", "sum", "max" or "min".
        bucket_bytes: capacity of one fused collective (per dtype).
        compression: "fp16" sends float tensors as float16 (gradients).

    Example::

        mean_grads = mldist.allreduce(grads)               # fused, averaged
        total = mldist.allreduce(tf.constant(n), op="sum")
    """
    _check(op, compression)
    ctx = runtime.init()
    tf = _tf()
    structure, flat = _as_tensors(tensors)
    if ctx.size == 1:
        return tf.nest.pack_sequence_as(structure, flat)
    if op in ("max", "min"):
        reduce_fn = tf.reduce_max if op == "max" else tf.reduce_min
        out = [reduce_fn(allgather(tf.expand_dims(t, 0)), axis=0) for t in flat]
        return tf.nest.pack_sequence_as(structure, out)
    if op == "mean":
        for t in flat:
            if not (t.dtype.is_floating or t.dtype.is_complex):
                raise ConfigError(f"op='mean' on a {t.dtype.name} tensor would truncate; use op='sum'")
    # Dividing before the sum keeps fp16 buffers from overflowing.
    prescale = 1.0 / ctx.size if op == "mean" else 1.0

    def run(*values: Any) -> list[Any]:
        return _fused_sum(list(values), bucket_bytes, compression, prescale)

    out = _in_graph(("allreduce", bucket_bytes, compression, prescale), run, *flat)
    return tf.nest.pack_sequence_as(structure, list(out))


def broadcast(tensors: Any, root: int = 0, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Any:
    """Every worker gets ``root``'s values of a tensor or structure of tensors.

    Implemented as a fused sum in which only ``root`` contributes, which is
    exact for every numeric dtype.

    Args:
        tensors: a tensor, or a list/tuple/dict of them.
        root: the rank whose values win.

    Example::

        values = mldist.broadcast([v.value() for v in model.weights], root=0)
    """
    ctx = runtime.init()
    if not 0 <= root < ctx.size:
        raise ConfigError(f"root={root} is not a rank of this world of {ctx.size}")
    tf = _tf()
    structure, flat = _as_tensors(tensors)
    if ctx.size == 1:
        return tf.nest.pack_sequence_as(structure, flat)
    keep = ctx.rank == root

    def run(*values: Any) -> list[Any]:
        cast = [tf.cast(v, tf.int32) if v.dtype == tf.bool else v for v in values]
        masked = [v if keep else tf.zeros_like(v) for v in cast]
        summed = _fused_sum(masked, bucket_bytes, None, 1.0)
        return [tf.cast(s, v.dtype) for s, v in zip(summed, values, strict=True)]

    out = _in_graph(("broadcast", bucket_bytes, keep), run, *flat)
    return tf.nest.pack_sequence_as(structure, list(out))


def allgather(tensor: Any) -> Any:
    """Concatenate every worker's tensor along the first axis, in rank order.

    The first dimension may differ between workers (e.g. the last batch).

    Args:
        tensor: a tensor of rank >= 1.

    Example::

        labels = mldist.allgather(local_labels)   # [sum of local lengths, ...]
    """
    ctx = runtime.init()
    tf = _tf()
    t = tf.convert_to_tensor(tensor)
    if t.shape.rank in (None, 0):
        raise ConfigError(f"allgather needs a tensor of rank >= 1, got shape {t.shape}")
    if ctx.size == 1:
        return t

    def run(value: Any) -> Any:
        n = tf.shape(value)[0]
        counts = _gather_tensor(tf.reshape(n, [1]))
        longest = tf.reduce_max(counts)
        pad = [[0, longest - n]] + [[0, 0]] * (value.shape.rank - 1)
        gathered = _gather_tensor(tf.pad(value, pad))
        rows = tf.reshape(gathered, tf.concat([[ctx.size, longest], tf.shape(value)[1:]], 0))
        mask = tf.sequence_mask(counts, longest)
        return tf.boolean_mask(rows, mask)

    return _in_graph(("allgather",), run, t)
