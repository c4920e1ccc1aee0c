"""Gradient averaging for Keras optimizers and plain training loops.

Example::

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = mldist.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged over workers
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, UnsupportedError
from .. import compat
from ..engines.engine import running
from ..start import worker as runtime
from .buckets import DEFAULT_BUCKET_BYTES, check_reduction
from .collectives import allreduce

XLA_CPU_FIX = (
    "XLA compiles no collectives between CPU workers (mldist's MPI and RING engines) "
    "(model.compile(jit_compile=True)); compile with jit_compile=False, or leave the default 'auto'"
)


ON_JAX = (
    "{what} averages TensorFlow gradients; on KERAS_BACKEND=jax the keras.distribution.DataParallel "
    "that mldist.init() set averages them inside Keras's compiled step: use model.fit, or a JAX step "
    "with Keras's stateless API"
)


def _check_not_jax(what: str) -> None:
    if runtime.init().decision.traits.averages_in_step:
        raise UnsupportedError(ON_JAX.format(what=what))


def _check_not_xla_on_cpu() -> None:
    if not running().xla_safe and compat.compiling_with_xla():
        raise ConfigError(XLA_CPU_FIX)


def average_gradients(
    grads: list[Any], bucket_bytes: int = DEFAULT_BUCKET_BYTES, compression: str | None = None
) -> list[Any]:
    """Mean of every worker's gradients, fused; ``None`` entries stay ``None``.

    Args:
        grads: one gradient (tensor, IndexedSlices or None) per variable.
        bucket_bytes: capacity of one fused collective.
        compression: "fp16" or "bf16" to send 16-bit floats.

    Example::

        grads = average_gradients(tape.gradient(loss, model.trainable_variables))
    """
    _check_not_jax("average_gradients")
    ctx = runtime.init()
    if ctx.size == 1:
        return grads
    _check_not_xla_on_cpu()
    import tensorflow as tf

    # Backprop makes the last layers' gradients first: bucketed in that order, their all-reduce
    # starts while the first layers' are still being computed.
    present = [i for i, g in enumerate(grads) if g is not None][::-1]
    # Sparse gradients (embeddings) are densified: one fused buffer beats many gathers.
    dense = [tf.convert_to_tensor(grads[i]) for i in present]
    reduced = allreduce(dense, "mean", bucket_bytes=bucket_bytes, compression=compression)
    out = list(grads)
    for i, g in zip(present, reduced, strict=True):
        out[i] = g
    return out


class DistributedGradientTape:
    """A ``tf.GradientTape`` whose ``gradient`` averages over all workers.

    Args:
        tape: the tape that recorded the forward pass.
        bucket_bytes: capacity of one fused collective.
        compression: None, "fp16" or "bf16".

    Example::

        grads = mldist.DistributedGradientTape(tape).gradient(loss, variables)
    """

    def __init__(self, tape: Any, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, compression: str | None = None) -> None:
        _check_not_jax("DistributedGradientTape")
        check_reduction(bucket_bytes, compression, averages_in_step=False)
        runtime.warn_idle_gpus()
        self._tape = tape
        self._bucket_bytes = bucket_bytes
        self._compression = compression

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        """Like ``tf.GradientTape.gradient``, averaged over workers."""
        import tensorflow as tf

        grads = self._tape.gradient(target, sources, *args, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        averaged = average_gradients(flat, self._bucket_bytes, self._compression)
        return tf.nest.pack_sequence_as(grads, averaged)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)
