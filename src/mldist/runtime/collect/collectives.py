"""In-graph collectives on the runtime that ``mldist.init()`` started.

Tensors are fused into buckets: one collective per dtype per bucket. With
one worker every function is an identity and adds no collective op. In eager
code the collective runs through a cached ``tf.function`` (MWMS is slow
eagerly); inside a ``tf.function`` it is traced in place. numpy arrays and Python
numbers come back as they went in, without TensorFlow, on every engine but RING and NCCL
(:mod:`mldist.runtime.collect.host_values`).

Example::

    import mldist, tensorflow as tf
    mldist.init()
    grads = mldist.allreduce([tf.ones([3]), tf.zeros([2, 2])], op="mean")
    weights = mldist.broadcast(weights, root=0)
    everyone = mldist.allgather(tf.constant([mldist.rank()]))
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from ...base import processwide
from ...errors import ConfigError, UnsupportedError
from .. import compat
from ..context import Context
from ..engines import subsets
from ..engines.engine import NO_SUBGROUPS, Engine, running
from ..start import worker as runtime
from ..watch.failures import Deferred, mismatch
from . import host_values
from .buckets import (
    COMPRESSION_ON_JAX,
    DEFAULT_BUCKET_BYTES,
    WIRE_DTYPES,
    Bucket,
    check_bucket_bytes,
    check_compression,
    plan_buckets,
)

OPS = ("mean", "sum", "max", "min", "prod")
__all__ = ["allgather", "allreduce", "broadcast"]


def _tf() -> Any:
    import tensorflow as tf

    return tf


def _check(op: str, bucket_bytes: object, compression: str | None) -> None:
    if op not in OPS:
        raise ConfigError(f"op={op!r} is not one of {', '.join(OPS)}")
    check_bucket_bytes(bucket_bytes)
    check_compression(compression)


def engine() -> Engine:
    """The engine that moves bytes for this run: the one ``init`` started (``ctx.communication``)."""
    eng = running()
    if subsets.active() is not None and not eng.subgroups:
        raise UnsupportedError(NO_SUBGROUPS.format(name=eng.name))
    return eng


def world() -> tuple[int, int]:
    """(size, rank) of the ranks collectives run over now: the active subset's, else the world's."""
    _, size, rank = _world()
    return size, rank


def _world() -> tuple[Context, int, int]:
    """This worker's context (``init``'s, started once here), then :func:`world`'s (size, rank)."""
    ctx = runtime.init()
    subset = subsets.active()
    return (ctx, ctx.size, ctx.rank) if subset is None else (ctx, subset.size(), subset.index(ctx.rank))


def _on_host(values: Any, call: Any, n: int) -> tuple[bool, Any]:
    """(True, ``call(host collectives, arrays)`` rebuilt in the caller's types) where ``values`` are numpy arrays
    or Python numbers and the engine has host collectives (:mod:`mldist.runtime.collect.host_values`);
    else (False, None)."""
    split = host_values.split(values)
    if split is None:
        return False, None
    host = engine().host
    if host is None:  # RING, NCCL: TensorFlow's own collectives take them as tensors
        return False, None
    flat, rebuild = split
    return True, rebuild(call(host, flat) if n > 1 else flat)


def _fuse(flat: list[Any], bucket_bytes: int) -> tuple[list[Bucket], list[Any]]:
    """Buckets of ``flat`` and one 1-D buffer per bucket (concatenated in bucket order)."""
    tf = _tf()
    # A tensor whose size is known only when the graph runs gets a bucket of its own.
    sizes = [t.shape.num_elements() for t in flat]
    items = [(t.dtype.name, bucket_bytes if n is None else n * t.dtype.size) for t, n in zip(flat, sizes, strict=True)]
    buckets = plan_buckets(items, bucket_bytes)
    buffers = []
    for bucket in buckets:
        parts = [tf.reshape(flat[i], [-1]) for i in bucket.indices]
        buffers.append(tf.concat(parts, 0) if len(parts) > 1 else parts[0])
    return buckets, buffers


def _unfuse(flat: list[Any], buckets: list[Bucket], buffers: list[Any]) -> list[Any]:
    """Split reduced buffers back into tensors shaped and typed like ``flat``."""
    tf = _tf()
    out: list[Any] = [None] * len(flat)
    for bucket, buf in zip(buckets, buffers, strict=True):
        buf = tf.cast(buf, flat[bucket.indices[0]].dtype)
        sizes = [flat[i].shape.num_elements() for i in bucket.indices]
        pieces = tf.split(buf, sizes) if len(sizes) > 1 else [buf]
        for i, piece in zip(bucket.indices, pieces, strict=True):
            shape = flat[i].shape if flat[i].shape.is_fully_defined() else tf.shape(flat[i])
            out[i] = tf.reshape(piece, shape)
    return out


def owned(buffers: list[Any], fresh: list[bool]) -> list[Any]:
    """``buffers`` that no other op reads: copies of those not ``fresh`` (made by this call's own ops).

    An in-place engine writes its result into its input; a buffer that is also the caller's
    tensor (a one-tensor bucket with nothing applied) must not be that input.
    """
    tf = _tf()
    return [b if new else tf.raw_ops.DeepCopy(x=b) for b, new in zip(buffers, fresh, strict=True)]


def _fused_reduce(flat: list[Any], op: str, bucket_bytes: int, compression: str | None, prescale: float) -> list[Any]:
    tf = _tf()
    buckets, buffers = _fuse(flat, bucket_bytes)
    fresh = [len(b.indices) > 1 for b in buckets]  # concatenated: a new tensor only this call holds
    if prescale != 1.0:  # dividing before the sum keeps fp16 buffers from overflowing
        buffers = [b * tf.cast(prescale, b.dtype) for b in buffers]
        fresh = [True] * len(buffers)
    if compression is not None:  # bf16 keeps float32's range (no overflow), fp16 3 more bits of precision
        wire = getattr(tf, WIRE_DTYPES[compression])
        fresh = [new or b.dtype in (tf.float32, tf.float64) for b, new in zip(buffers, fresh, strict=True)]
        buffers = [tf.cast(b, wire) if b.dtype in (tf.float32, tf.float64) else b for b in buffers]
    eng = engine()
    if eng.in_place:
        buffers = owned(buffers, fresh)
    return _unfuse(flat, buckets, eng.allreduce(buffers, op, layout(flat)))


def layout(tensors: list[Any]) -> int:
    """A number for the static shapes of ``tensors`` (0 when one is not fully known): ranks that flatten
    other shapes of the same sizes must not reduce them together.

    Example:
        >>> import tensorflow as tf
        >>> layout([tf.zeros([2, 3])]) == layout([tf.zeros([6])]), layout([tf.zeros([2, 3])]) > 0
        (False, True)
    """
    if not all(t.shape.is_fully_defined() for t in tensors):
        return 0
    return zlib.crc32(repr([tuple(t.shape) for t in tensors]).encode()) & 0x7FFFFFFF or 1


def _as_tensors(tensors: Any) -> tuple[Any, list[Any]]:
    tf = _tf()
    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tensors)]
    for t in flat:
        if t.shape.rank is None:
            raise ConfigError(f"a tensor of unknown rank ({t.dtype.name}); collectives need at least the rank")
    return tensors, flat


_FUNCTIONS: dict[tuple[Any, ...], Any] = {}


class _QuietOwnTracing:
    """Drop TensorFlow's "triggered tf.function retracing" warning about this module's functions.

    Each of them is traced once per signature by design (``_in_graph``), but TensorFlow counts
    traces per source function and would call that excessive retracing in the user's log. A logger
    takes any object with a ``filter`` method: no ``logging.Filter`` base, so a job that never traces
    a collective (numpy under the MPI engine) does not import :mod:`logging`.
    """

    def filter(self, record: Any) -> bool:
        text = record.getMessage()
        return not ("tf.function retracing" in text and any(f"{n}.<locals>.run" in text for n in __all__))


def _quiet_own_tracing() -> None:
    processwide.log_filter(_QUIET, "tensorflow", _QuietOwnTracing)


#: Its entry in :data:`mldist.base.processwide.PATCHES`.
_QUIET = "logging: TensorFlow's retracing warnings of mldist's collectives"


def _in_graph(key: tuple[Any, ...], fn: Any, *args: Any) -> Any:
    """Run ``fn`` traced: MWMS collectives are slow and noisy in eager mode.

    ``key`` names everything ``fn`` closes over; with the arguments' shapes and
    dtypes it picks the one ``tf.function`` that serves all such eager calls.
    """
    tf = _tf()
    if not tf.executing_eagerly():
        return fn(*args)
    # One function per signature too: each traces once, and TensorFlow's retracing warning stays quiet.
    key = (*key, subsets.key(), *((tuple(a.shape), a.dtype.name) for a in args))
    if key not in _FUNCTIONS:
        _quiet_own_tracing()
        _FUNCTIONS[key] = tf.function(fn)
    Deferred.active += 1
    try:
        with compat.no_tape_recording():
            out = _FUNCTIONS[key](*args)
    finally:
        Deferred.active -= 1
    if found := Deferred.take():  # ranks that disagreed: Horovod's FailedPreconditionError, one line
        raise mismatch(found)
    return out


def _host(tensors: Any, call: Any) -> Any:
    """A collective on the JAX backend: numpy arrays in the same structure, through the host engine.

    Keras averages gradients inside its compiled step there; these serve callbacks, checkpoints
    and preemption, eagerly, so every value comes back as a numpy array.
    """
    import jax

    leaves, tree = jax.tree_util.tree_flatten(tensors)
    flat = [np.asarray(leaf) for leaf in leaves]
    n, _ = world()
    out = call(engine(), flat) if n > 1 else flat
    return jax.tree_util.tree_unflatten(tree, out)


def _host_reduce(op: str, n: int) -> Any:
    def call(eng: Engine, flat: list[Any]) -> list[Any]:
        if op == "mean":
            for a in flat:
                if not np.issubdtype(a.dtype, np.inexact):
                    raise ConfigError(f"op='mean' on a {a.dtype.name} tensor would truncate; use op='sum'")
        out = eng.allreduce(flat, "sum" if op == "mean" else op)
        return [(a / n).astype(a.dtype) for a in out] if op == "mean" else out

    return call


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
        op: "mean", "sum", "max", "min" or "prod".
        bucket_bytes: capacity of one fused collective (per dtype).
        compression: "fp16" or "bf16" sends float tensors as float16 or bfloat16 (gradients).

    Example::

        mean_grads = mldist.allreduce(grads)               # fused, averaged
        total = mldist.allreduce(tf.constant(n), op="sum")
    """
    _check(op, bucket_bytes, compression)
    ctx, n, _ = _world()
    if compression is None:  # (a 16-bit wire is TensorFlow's cast: compressed values go as tensors)
        done, out = _on_host(tensors, _host_reduce(op, n), n)
        if done:
            return out
    if not ctx.decision.traits.runs_tensorflow:
        if compression is not None:  # the host engine sends numpy arrays as they are: no 16-bit wire there
            why = "values travel between the hosts as numpy arrays in their own dtype there"
            raise UnsupportedError(COMPRESSION_ON_JAX.format(compression=compression, why=why))
        return _host(tensors, _host_reduce(op, n))
    tf = _tf()
    structure, flat = _as_tensors(tensors)
    if n == 1:
        return tf.nest.pack_sequence_as(structure, flat)
    if op == "mean":
        for t in flat:
            if not (t.dtype.is_floating or t.dtype.is_complex):
                raise ConfigError(f"op='mean' on a {t.dtype.name} tensor would truncate; use op='sum'")
    prescale = 1.0 / n if op == "mean" else 1.0
    wire_op = "sum" if op == "mean" else op
    if wire_op != "sum":
        compression = None  # max/min/prod of rounded values would not be exact

    def run(*values: Any) -> list[Any]:
        return _fused_reduce(list(values), wire_op, bucket_bytes, compression, prescale)

    out = _in_graph(("allreduce", wire_op, bucket_bytes, compression, prescale), run, *flat)
    return tf.nest.pack_sequence_as(structure, list(out))


def broadcast(tensors: Any, root: int = 0, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Any:
    """Every worker gets ``root``'s values of a tensor or structure of tensors.

    Tensors are fused per dtype and bucket, like :func:`allreduce`.

    Args:
        tensors: a tensor, or a list/tuple/dict of them.
        root: the rank whose values win.

    Example::

        values = mldist.broadcast([v.value() for v in model.weights], root=0)
    """
    ctx, n, me = _world()
    if not 0 <= root < n:
        raise ConfigError(f"root={root} is not a rank of this world of {n}")
    done, out = _on_host(tensors, lambda eng, flat: eng.broadcast(flat, root, me), n)
    if done:
        return out
    if not ctx.decision.traits.runs_tensorflow:
        return _host(tensors, lambda eng, flat: eng.broadcast(flat, root, me))
    tf = _tf()
    structure, flat = _as_tensors(tensors)
    if n == 1:
        return tf.nest.pack_sequence_as(structure, flat)

    def run(*values: Any) -> list[Any]:
        flat_values = list(values)
        buckets, buffers = _fuse(flat_values, bucket_bytes)
        return _unfuse(flat_values, buckets, engine().broadcast(buffers, root, me))

    out = _in_graph(("broadcast", bucket_bytes, root, me), run, *flat)
    return tf.nest.pack_sequence_as(structure, list(out))


def allgather(tensor: Any) -> Any:
    """Concatenate every worker's tensor along the first axis, in rank order.

    The first dimension may differ between workers (e.g. the last batch).

    Args:
        tensor: a tensor of rank >= 1.

    Example::

        labels = mldist.allgather(local_labels)   # [sum of local lengths, ...]
    """
    ctx, n, _ = _world()
    # numpy, a number, or a list of numbers (one array, as tf.convert_to_tensor takes it) on host collectives
    plain = isinstance(tensor, np.ndarray | np.generic | int | float | complex)
    if (plain or host_values.split(tensor) is not None) and engine().host is not None:
        if np.ndim(tensor) < 1:
            raise ConfigError(f"allgather needs a tensor of rank >= 1, got shape {np.shape(tensor)}")
        return _on_host(np.asarray(tensor), lambda eng, flat: [eng.allgather(flat[0], n)], n)[1]
    if not ctx.decision.traits.runs_tensorflow:
        if np.ndim(tensor) < 1:
            raise ConfigError(f"allgather needs a tensor of rank >= 1, got shape {np.shape(tensor)}")
        return _host(tensor, lambda eng, flat: [eng.allgather(flat[0], n)])
    tf = _tf()
    t = tf.convert_to_tensor(tensor)
    if t.shape.rank in (None, 0):
        raise ConfigError(f"allgather needs a tensor of rank >= 1, got shape {t.shape}")
    if n == 1:
        return t

    def run(value: Any) -> Any:
        return engine().allgather(value, n)

    return _in_graph(("allgather",), run, t)
