"""Distributed optimizers: gradients are averaged across workers before they are applied.

Keras 3 ``model.fit`` cannot run under MultiWorkerMirroredStrategy with 2+
workers (keras#20585), so the model stays outside any strategy scope and the
optimizer all-reduces the gradients in-graph, in fused buckets, through the
collective runtime that ``mldist.init()`` started.

Example::

    opt = mldist.keras.DistributedOptimizer(keras.optimizers.Adam(mldist.keras.scale_lr(1e-3)))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(ds, callbacks=mldist.keras.default_callbacks())
"""

from __future__ import annotations

from typing import Any

from .. import runtime
from ..runtime import compat
from ..runtime.collectives import DEFAULT_BUCKET_BYTES, check_compression
from ..runtime.gradients import average_gradients


class _DistributedKeras3:
    """Mixin placed before a Keras 3 optimizer class."""

    _mldist_bucket_bytes = DEFAULT_BUCKET_BYTES
    _mldist_compression: str | None = None

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = average_gradients(list(grads), self._mldist_bucket_bytes, self._mldist_compression)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]


class _DistributedLegacy:
    """Mixin placed before a tf_keras (Keras 2) optimizer class."""

    _mldist_bucket_bytes = DEFAULT_BUCKET_BYTES
    _mldist_compression: str | None = None

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        grads = average_gradients([g for g, _ in pairs], self._mldist_bucket_bytes, self._mldist_compression)
        return super().apply_gradients(  # type: ignore[misc]
            zip(grads, [v for _, v in pairs], strict=True), *args, **kwargs
        )


def DistributedOptimizer(
    optimizer: Any, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, compression: str | None = None
) -> Any:
    """Wrap a Keras optimizer so gradients are averaged across workers first.

    Works for Keras 3 optimizers and legacy ``tf_keras`` ones. The returned
    optimizer has the same class name and module, so saved models load
    without mldist. Non-chief ranks stop printing progress bars.

    Args:
        optimizer: any Keras optimizer instance (not yet used).
        bucket_bytes: capacity of one fused collective.
        compression: None, or "fp16" to halve the bytes sent.

    Example::

        opt = DistributedOptimizer(keras.optimizers.SGD(0.01 * mldist.size()))
    """
    from .callbacks import quiet_unless_chief

    runtime.init()
    check_compression(compression)
    cls = type(optimizer)
    if getattr(cls, "_mldist_distributed", False):
        return optimizer
    mixin = _DistributedLegacy if compat.is_legacy_optimizer(optimizer) else _DistributedKeras3
    wrapped: Any = type(
        cls.__name__,
        (mixin, cls),
        {
            "__module__": cls.__module__,
            "_mldist_distributed": True,
            "_mldist_bucket_bytes": bucket_bytes,
            "_mldist_compression": compression,
        },
    )
    quiet_unless_chief()
    return wrapped.from_config(optimizer.get_config())
