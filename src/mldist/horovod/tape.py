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

from ..errors import ConfigError
from ..runtime.collect.gradients import XLA_CPU_FIX
from ..runtime.engines.engine import running
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
    process_set: Any = None


def make_reduction(
    op: int | None, compression: Any, sparse_as_dense: bool, gradient_predivide_factor: float, process_set: Any
) -> Reduction:
    """Validate Horovod's gradient arguments once, when the tape or optimizer is made."""
    check_process_set(process_set)
    resolved = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and resolved != Average:
        raise ConfigError("gradient_predivide_factor only applies to op=hvd.Average")
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise ConfigError(f"compression={compression!r} is not a compressor: use hvd.Compression.none, .fp16 or .bf16")
    return Reduction(resolved, compression, bool(sparse_as_dense), float(gradient_predivide_factor), process_set)


def var_key(variable: Any) -> Any:
    """A hashable identity of a variable: TensorFlow's ``ref()``, else the object (Keras 3 variables)."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def local_flags(variables: Any, local: set[Any], layers: Any = ()) -> list[bool] | None:
    """Which of ``variables`` stay on their rank: registered (by :func:`var_key`) or weights of ``layers``.

    None when nothing is local (the common case: every gradient is reduced).
    """
    keys = set(local) | {var_key(w) for layer in layers for w in layer.trainable_weights}
    if not keys or variables is None:
        return None
    return [var_key(v) in keys for v in variables]


def _keep_local(grads: list[Any], local: list[bool], scale: bool) -> list[Any]:
    """The local gradients, divided by the world size when ``scale`` (Horovod's scale_local_gradients)."""
    import tensorflow as tf

    def scaled(g: Any) -> Any:
        if g is None or not scale:
            return g
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values / basics.set_size(), g.indices, g.dense_shape)
        return g / tf.cast(basics.set_size(), g.dtype)

    return [scaled(g) if is_local else None for g, is_local in zip(grads, local, strict=True)]


def reduce_gradients(
    grads: list[Any], how: Reduction, local: list[bool] | None = None, scale_local: bool = True
) -> list[Any]:
    """Reduce one gradient per variable across ranks (of ``how.process_set``); ``None`` stays ``None``;
    ``local`` ones stay here."""
    if basics.size() == 1:
        return grads
    with basics.scope(how.process_set):
        if local is not None and any(local):
            kept = _keep_local(grads, local, scale_local)
            shared = _reduce([None if is_local else g for g, is_local in zip(grads, local, strict=True)], how)
            return [k if is_local else s for k, s, is_local in zip(kept, shared, local, strict=True)]
        return _reduce(grads, how)


def _reduce(grads: list[Any], how: Reduction) -> list[Any]:
    import tensorflow as tf

    from ..runtime import compat

    basics.context()
    if not running().xla_safe and compat.compiling_with_xla():
        raise ConfigError(XLA_CPU_FIX)
    if how.sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    # Last layers first, as backprop makes them: each bucket's all-reduce starts while backprop goes on.
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)][::-1]
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
        compression: hvd.Compression.none, .fp16 or .bf16 (mldist's).
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
        self._local: set[Any] = set()
        self._scale_local = bool(scale_local_gradients)

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient on this rank (divided by the world size unless scale_local_gradients=False)."""
        self._local.add(var_key(source))

    def get_local_and_global_gradients(
        self, target: Any, sources: Any, output_gradients: Any = None, use_generic_names: bool = False
    ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """Horovod's: :meth:`gradient`'s results as ``(source, gradient)`` pairs, the local sources' first."""
        import tensorflow as tf

        flat = tf.nest.flatten(sources, expand_composites=False)
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients), expand_composites=False)
        local = local_flags(flat, self._local) or [False] * len(flat)
        pairs = list(zip(flat, grads, strict=True))
        return [p for p, mine in zip(pairs, local, strict=True) if mine], [
            p for p, mine in zip(pairs, local, strict=True) if not mine
        ]

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        """Like ``tf.GradientTape.gradient``, reduced across ranks (registered local sources stay local)."""
        import tensorflow as tf

        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        local = local_flags(tf.nest.flatten(sources, expand_composites=False), self._local)
        return tf.nest.pack_sequence_as(grads, reduce_gradients(flat, self._how, local, self._scale_local))

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def PartialDistributedGradientTape(
    gradtape: Any,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    local_layers: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> DistributedGradientTape:
    """A :class:`DistributedGradientTape` that keeps the gradients of ``local_layers``' weights on each rank.

    Example::

        tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.layers[-1]])
    """
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for layer in local_layers or ():
        for weight in layer.trainable_weights:
            tape.register_local_source(weight)
    return tape
