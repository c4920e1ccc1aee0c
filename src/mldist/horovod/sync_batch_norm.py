"""``SyncBatchNormalization``: batch statistics over every rank's batch while training.

Each rank computes its batch's mean and mean of squares per channel; one fused
all-reduce, weighted by each rank's element count, gives the statistics of the
union batch, so the layer normalises exactly as ``BatchNormalization`` on the
whole global batch would (also when the last batches differ in size). The
all-reduce is differentiable: gradients flow back to every rank's inputs.
Inference uses the moving averages, as usual. Built on the Keras that
``tf.keras`` means here (tf_keras under ``TF_USE_LEGACY_KERAS=1``, else Keras 3).

Example::

    import mldist.horovod.tensorflow.keras as hvd
    layer = hvd.SyncBatchNormalization(momentum=0.9)
"""

from __future__ import annotations

from typing import Any

from . import basics
from .basics import Sum
from .keras_flavour import keras_module, legacy_requested


def _union_moments(mean: Any, variance: Any, count: Any) -> tuple[Any, Any]:
    """The mean and variance over all ranks from each rank's ``mean``, ``variance`` and element count."""
    import tensorflow as tf

    from .ops import allreduce

    dtype = mean.dtype
    wide = tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype  # sums of squares overflow float16
    count = tf.cast(count, wide)
    mean, variance = tf.cast(mean, wide), tf.cast(variance, wide)
    stacked = tf.stack([mean * count, (variance + tf.square(mean)) * count, tf.ones_like(mean) * count])
    total = allreduce(stacked, op=Sum)
    union_mean = total[0] / total[2]
    union_variance = tf.maximum(total[1] / total[2] - tf.square(union_mean), 0.0)
    return tf.cast(union_mean, dtype), tf.cast(union_variance, dtype)


def _elements(inputs: Any, axes: Any) -> Any:
    """How many values each channel's statistics summarise on this rank."""
    import tensorflow as tf

    shape = tf.shape(inputs)
    return tf.reduce_prod(tf.gather(shape, list(axes)))


def _arguments(fused: bool | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The layer's arguments: Horovod refuses ``fused`` (the fused kernel cannot share statistics)."""
    if fused in (True, None):
        raise ValueError("SyncBatchNormalization does not support fused=True")
    return {"name": "sync_batch_normalization", **kwargs}


def _keras3_class(base: type) -> type:
    class SyncBatchNormalization(base):  # type: ignore[misc, valid-type]
        """Batch normalization whose training statistics cover every rank's batch."""

        def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
            super().__init__(**_arguments(fused, kwargs))

        def _moments(self, inputs: Any, mask: Any) -> Any:
            mean, variance = super()._moments(inputs, mask)
            if basics.size() == 1:
                return mean, variance
            return _union_moments(mean, variance, _elements(inputs, self._reduction_axes))

    return SyncBatchNormalization


def _legacy_class(base: type) -> type:
    class SyncBatchNormalization(base):  # type: ignore[misc, valid-type]
        """Batch normalization whose training statistics cover every rank's batch."""

        def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
            super().__init__(fused=False, **_arguments(fused, kwargs))

        def _moments(self, inputs: Any, reduction_axes: Any, keep_dims: bool, **kwargs: Any) -> Any:
            mean, variance = super()._moments(inputs, reduction_axes, keep_dims=keep_dims, **kwargs)
            if basics.size() == 1:
                return mean, variance
            return _union_moments(mean, variance, _elements(inputs, reduction_axes))

    return SyncBatchNormalization


_base = keras_module().layers.BatchNormalization
SyncBatchNormalization = _legacy_class(_base) if legacy_requested() else _keras3_class(_base)
SyncBatchNormalization.__qualname__ = "SyncBatchNormalization"
