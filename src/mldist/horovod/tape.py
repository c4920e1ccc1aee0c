"""Horovod's ``DistributedGradientTape``: gradients reduced across ranks, for Keras 3 and tf_keras variables.

Dense gradients go in one fused collective; IndexedSlices (embeddings) are
gathered as Horovod does unless ``sparse_as_dense=True``.

Example::

    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, UnsupportedError
from ..runtime.gradients import XLA_CPU_FIX
from . import basics
from .basics import Average, check_process_set
from .compression import Compression
from .ops import _sparse, reduce_dense, resolve_op


@dataclass(frozen=True)
class Reduction:
    """How gradients are combined: Horovod's ``op``, ``compression``, ``sparse_as_dense``, predivide factor."""

    op: int = Average
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    predivide: float = 1.0


def make_reduction(
    op: int | None, compression: Any, sparse_as_dense: bool, gradient_predivide_factor: float, process_set: Any
) -> Reduction:
    """Validate Horovod's gradient arguments once, when the tape or optimizer is made."""
    check_process_set(process_set)
    resolved = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and resolved != Average:
        raise ConfigError("gradient_predivide_factor only applies to op=hvd.Average")
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise ConfigError(f"compression={compression!r}: use hvd.Compression.none or hvd.Compression.fp16")
    return Reduction(resolved, compression, bool(sparse_as_dense), float(gradient_predivide_factor))


def reduce_gradients(grads: list[Any], how: Reduction) -> list[Any]:
    """Reduce one gradient per variable across ranks; ``None`` stays ``None``."""
    if basics.size() == 1:
        return grads
    import tensorflow as tf

    from ..runtime import compat

    if basics.context().communication != "nccl" and compat.compiling_with_xla():
        raise ConfigError(XLA_CPU_FIX)
    if how.sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    prescale, postscale = 1.0 / how.predivide, how.predivide
    tensors = [tf.convert_to_tensor(grads[i]) for i in dense]
    reduced = reduce_dense(tensors, how.op, prescale, postscale, how.compression)
    out = list(grads)
    for i, g in zip(dense, reduced, strict=True):
        out[i] = g
    return [_sparse(g, how.op) if isinstance(g, tf.IndexedSlices) else g for g in out]


class DistributedGradientTape:
    """A ``tf.GradientTape`` whose ``gradient`` is reduced across ranks (Horovod's arguments).

    Args:
        gradtape: the tape that recorded the forward pass.
        compression: hvd.Compression.none or .fp16.
        sparse_as_dense: densify IndexedSlices before reducing.
        op: hvd.Average (default) or hvd.Sum (Min/Max/Product work but rarely make sense).
        gradient_predivide_factor: with Average, divide by this before the sum and by size/this after.
        device_dense, device_sparse, num_groups, groups, scale_local_gradients: accepted; mldist
            fuses every dense gradient into one collective per dtype.

    Example::

        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    """

    def __init__(
        self,
        gradtape: Any,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Any = Compression.none,
        sparse_as_dense: bool = False,
        op: int = Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        process_set: Any = None,
        scale_local_gradients: bool = True,
    ) -> None:
        basics.context()
        self._tape = gradtape
        self._how = make_reduction(op, compression, sparse_as_dense, gradient_predivide_factor, process_set)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        """Like ``tf.GradientTape.gradient``, reduced across ranks."""
        import tensorflow as tf

        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        return tf.nest.pack_sequence_as(grads, reduce_gradients(flat, self._how))

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def PartialDistributedGradientTape(*args: Any, **kwargs: Any) -> Any:
    """Refused: local (non-reduced) layers are not supported."""
    raise UnsupportedError(
        "PartialDistributedGradientTape is not provided by mldist; reduce every gradient with "
        "hvd.DistributedGradientTape, or reduce a subset yourself with hvd.grouped_allreduce"
    )
