"""Horovod's Adasum: adaptive summation of gradients, as a tree of pairwise combinations.

Two vectors ``a`` and ``b`` combine to ``(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b``:
orthogonal gradients add up, equal ones average, and anything between is weighted by how
much they agree. Ranks combine in pairs at distance 1, then 2, 4, ... (rank 0 with 1, 2
with 3, then the pairs), as Horovod's recursive halving does; dot products are taken per
tensor. Every rank gathers all ranks' tensors and computes the same tree, so the result is
identical everywhere (this costs a gather: fine on CPUs, not tuned for large models). The
number of ranks must be a power of two, as in Horovod.

Example::

    combine(tf.constant([1.0, 0.0]), tf.constant([0.0, 1.0]))   # [1, 1]: orthogonal, added
    combine(tf.ones([2]), tf.ones([2]))                          # [1, 1]: equal, averaged
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError


def combine(a: Any, b: Any) -> Any:
    """Adasum of two float tensors of one shape (a zero tensor leaves the other unchanged)."""
    tf = _tf()
    dot = tf.reduce_sum(a * b)
    wa = 1.0 - tf.math.divide_no_nan(dot, 2.0 * tf.reduce_sum(a * a))
    wb = 1.0 - tf.math.divide_no_nan(dot, 2.0 * tf.reduce_sum(b * b))
    return wa * a + wb * b


def _tf() -> Any:
    import tensorflow as tf

    return tf


def check_size(size: int) -> None:
    """Raise ConfigError unless ``size`` is a power of two (Horovod's condition for Adasum).

    Example:
        >>> check_size(4)
    """
    if size < 1 or size & (size - 1):
        raise ConfigError(f"op=hvd.Adasum needs a power-of-two number of ranks, not {size}; use hvd.Average")


def tree(parts: list[Any]) -> Any:
    """The Adasum of ``parts`` (one per rank, in rank order): pairs at distance 1, then 2, 4, ..."""
    while len(parts) > 1:
        parts = [combine(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def adasum(tensor: Any, size: int) -> Any:
    """The Adasum of every rank's ``tensor`` (float), computed alike on every rank."""
    from .. import runtime

    tf = _tf()
    check_size(size)
    wide = tf.float32 if tensor.dtype in (tf.float16, tf.bfloat16) else tensor.dtype
    gathered = runtime.allgather(tf.expand_dims(tf.cast(tensor, wide), 0))
    return tf.cast(tree([gathered[i] for i in range(size)]), tensor.dtype)
