"""What one fused reduction may be asked, decided before any tensor moves: bucket sizes, compressions, and
the buckets of a list of tensors. Pure: no TensorFlow, so the checks run where a value is given.

Example:
    >>> [b.indices for b in plan_buckets([("float32", 8), ("float32", 8)], 16)]
    [(0, 1)]
    >>> check_reduction(DEFAULT_BUCKET_BYTES, "bf16", averages_in_step=False)
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import ConfigError, UnsupportedError

#: Default bucket size. Buckets start their all-reduce as backprop fills them (last layers first); only
#: the last one (the first layers') cannot overlap compute. MobileNetV2 (14 MB of gradients), 2 workers
#: on loopback, ms a step: one bucket 298, 16 MB 331 (noisy), 4 MB 264, 1 MB 277; before overlap 314.
DEFAULT_BUCKET_BYTES = 4 * 1024 * 1024
COMPRESSIONS = (None, "fp16", "bf16")
#: The dtype each compression sends float32/float64 tensors as.
WIRE_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


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


def check_compression(compression: str | None) -> None:
    """Raise ConfigError unless ``compression`` is one of :data:`COMPRESSIONS`.

    Example:
        >>> check_compression("bf16")
        >>> check_compression("int8")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: compression='int8' is not a compression: use 'fp16' or 'bf16' ... or None
    """
    if compression not in COMPRESSIONS:
        raise ConfigError(
            f"compression={compression!r} is not a compression: use 'fp16' or 'bf16' (16-bit gradients) or None"
        )


def check_bucket_bytes(bucket_bytes: object) -> int:
    """``bucket_bytes`` when it is a whole number of bytes, at least 1; else a ConfigError naming it.

    Checked where it is given (the optimizer, the tape, ``allreduce``), not at the first step of a
    ``fit`` on 2 workers: a bad value there is a traceback from inside TensorFlow's tracing.

    Example:
        >>> check_bucket_bytes(1 << 20)
        1048576
        >>> check_bucket_bytes("abc")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: bucket_bytes='abc' is not a size in bytes: give a whole number of at least 1 ...
    """
    if isinstance(bucket_bytes, numbers.Integral) and not isinstance(bucket_bytes, bool) and int(bucket_bytes) >= 1:
        return int(bucket_bytes)
    raise ConfigError(
        f"bucket_bytes={bucket_bytes!r} is not a size in bytes: give a whole number of at least 1 "
        f"(the default is {DEFAULT_BUCKET_BYTES}, 4 MiB), or leave it out"
    )


#: Why 16-bit gradients cannot be had where Keras averages inside its compiled step (JAX).
COMPRESSION_ON_JAX = (
    "compression={compression!r} cannot apply on KERAS_BACKEND=jax: {why}; drop compression= there "
    "(on KERAS_BACKEND=tensorflow it sends 16-bit gradients)"
)


def check_reduction(bucket_bytes: object, compression: str | None, averages_in_step: bool) -> None:
    """Refuse, in one line, a bucket size or a compression that this run could not use.

    Args:
        bucket_bytes: the capacity of one fused collective.
        compression: None, "fp16" or "bf16".
        averages_in_step: whether the engine averages inside the framework's compiled step
            (``ctx.decision.traits.averages_in_step``: Keras on JAX), where nothing of ours
            touches the gradients, so a compression would do nothing and say nothing.

    Example:
        >>> check_reduction(4096, "bf16", averages_in_step=False)
        >>> check_reduction(4096, "bf16", averages_in_step=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mldist.errors.UnsupportedError: compression='bf16' cannot apply on KERAS_BACKEND=jax: ...
    """
    check_bucket_bytes(bucket_bytes)
    check_compression(compression)
    if compression is not None and averages_in_step:
        why = "Keras averages the gradients inside its compiled step there, in XLA, in their own dtype"
        raise UnsupportedError(COMPRESSION_ON_JAX.format(compression=compression, why=why))
