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
from ..errors import ConfigError
from ..runtime import compat
from ..runtime.collect.buckets import DEFAULT_BUCKET_BYTES, check_reduction
from ..runtime.collect.gradients import average_gradients
from ..runtime.start import worker
from ..runtime.start.patches import VariableList


class DistributedKeras3:
    """Mixin placed before a Keras 3 optimizer class: ``apply`` reduces the gradients first."""

    _mldist_bucket_bytes = DEFAULT_BUCKET_BYTES
    _mldist_compression: str | None = None

    def _mldist_reduce(self, grads: list[Any], variables: Any = None) -> list[Any]:
        return average_gradients(grads, self._mldist_bucket_bytes, self._mldist_compression)

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        variables = (
            trainable_variables if trainable_variables is not None else getattr(self, "_trainable_variables", None)
        )
        return super().apply(self._mldist_reduce(list(grads), variables), trainable_variables)  # type: ignore[misc]

    @property
    def variables(self) -> VariableList:
        """Keras 3's list of the optimizer's variables, which Keras 2's ``opt.variables()`` may also call."""
        return VariableList(super().variables)  # type: ignore[misc]


class DistributedLegacy:
    """Mixin placed before a tf_keras (Keras 2) optimizer class: ``apply_gradients`` reduces first."""

    _mldist_bucket_bytes = DEFAULT_BUCKET_BYTES
    _mldist_compression: str | None = None

    def _mldist_reduce(self, grads: list[Any], variables: Any = None) -> list[Any]:
        return average_gradients(grads, self._mldist_bucket_bytes, self._mldist_compression)

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        grads = self._mldist_reduce([g for g, _ in pairs], [v for _, v in pairs])
        return super().apply_gradients(  # type: ignore[misc]
            zip(grads, [v for _, v in pairs], strict=True), *args, **kwargs
        )


def distributed_class(cls: type, mixins: tuple[type, type], attrs: dict[str, Any]) -> type:
    """``cls`` with the Keras 3 or the legacy mixin of ``mixins`` in front, same name and module.

    Keeping the name and module lets saved models load without mldist.
    """
    if getattr(cls, "_mldist_distributed", False):
        return cls
    legacy = compat.legacy_optimizer_class(cls)
    mixin = mixins[1] if legacy else mixins[0]
    return type(cls.__name__, (mixin, cls), {"__module__": cls.__module__, "_mldist_distributed": True, **attrs})


def _on_jax(optimizer: Any, size: int) -> Any:
    """The optimizer itself: on JAX, Keras's DataParallel already averages the global batch's gradients.

    ``mldist.init()`` set that distribution over every process's devices; the compiled step
    computes the loss of the global batch, so its gradient is the average a reduction would give
    (tests/workers/fit_modes.py "equivalence" proves it against one process on the whole batch).
    """
    import keras

    from .callbacks import quiet_unless_chief

    if size > 1 and keras.distribution.distribution() is None:
        raise ConfigError(
            "KERAS_BACKEND=jax with several workers needs Keras's distribution, which mldist.init() sets: "
            "do not call keras.distribution.set_distribution(None) after it"
        )
    quiet_unless_chief()
    return optimizer


def DistributedOptimizer(
    optimizer: Any, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, compression: str | None = None
) -> Any:
    """Wrap a Keras optimizer so gradients are averaged across workers first.

    Works for Keras 3 optimizers and legacy ``tf_keras`` ones. On ``KERAS_BACKEND=jax`` it
    returns ``optimizer`` itself: the distribution ``mldist.init()`` set averages there. The returned
    optimizer has the same class name and module, so saved models load
    without mldist. Non-chief ranks stop printing progress bars.

    Args:
        optimizer: any Keras optimizer instance (not yet used).
        bucket_bytes: capacity of one fused collective, a whole number of bytes (checked here).
        compression: None, or "fp16" or "bf16" to halve the bytes sent (TensorFlow backend only:
            on JAX, Keras averages in its compiled step, and a compression is refused in one line).

    Example::

        opt = DistributedOptimizer(keras.optimizers.SGD(0.01 * mldist.size()))
    """
    from .callbacks import quiet_unless_chief

    ctx = runtime.init()
    check_reduction(bucket_bytes, compression, ctx.decision.traits.averages_in_step)
    if ctx.decision.traits.averages_in_step:
        return _on_jax(optimizer, ctx.size)
    worker.warn_idle_gpus()
    if getattr(type(optimizer), "_mldist_distributed", False):
        return optimizer
    attrs = {"_mldist_bucket_bytes": bucket_bytes, "_mldist_compression": compression}
    wrapped: Any = distributed_class(type(optimizer), (DistributedKeras3, DistributedLegacy), attrs)
    quiet_unless_chief()
    return wrapped.from_config(optimizer.get_config())
