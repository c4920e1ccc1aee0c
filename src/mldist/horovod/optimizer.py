"""Horovod's Keras ``DistributedOptimizer`` and ``load_model``, for Keras 3 and tf_keras.

The wrapped optimizer keeps its class name and module (saved models load with
or without mldist) and reduces gradients across ranks in ``apply`` (Keras 3)
or ``apply_gradients`` (tf_keras), so it works in ``model.fit`` and custom
loops. ``backward_passes_per_step=N`` sums N local gradients and reduces and
applies them once every N calls.

Example::

    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, UnsupportedError
from ..keras.optimizer import DistributedKeras3, DistributedLegacy, distributed_class
from . import basics
from .basics import Average
from .compression import Compression
from .tape import Reduction, local_flags, make_reduction, reduce_gradients, var_key


class _Accumulating:
    """Horovod's reduction and local gradient accumulation, shared by both Keras flavours."""

    _hvd_how = Reduction()
    _hvd_passes = 1
    _hvd_average_aggregated = False
    _hvd_scale_local = True

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient on this rank (Horovod's local variables; scaled by 1/size by default)."""
        self.__dict__.setdefault("_hvd_local", set()).add(var_key(var))  # in __dict__: Keras must not track it

    def _mldist_reduce(self, grads: list[Any], variables: Any = None) -> list[Any]:
        layers = self.__dict__.get("_hvd_local_layers", ())
        local = local_flags(
            None if variables is None else list(variables), self.__dict__.get("_hvd_local", set()), layers
        )
        return reduce_gradients(grads, self._hvd_how, local, self._hvd_scale_local)

    def _hvd_build(self, variables: list[Any]) -> None:
        raise NotImplementedError

    def _hvd_accumulate(self, grads: list[Any], variables: list[Any], apply: Any) -> Any:
        """Add ``grads`` to local sums; every ``_hvd_passes`` calls, ``apply`` the sums and zero them."""
        import tensorflow as tf

        self._hvd_build(variables)
        state = self.__dict__.setdefault("_hvd_state", {})  # plain dict: Keras must not track these
        if "sums" not in state:
            with tf.init_scope():
                state["sums"] = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
                state["count"] = tf.Variable(0, dtype=tf.int64, trainable=False)
        sums, count = state["sums"], state["count"]
        present = [g is not None for g in grads]
        for s, g in zip(sums, grads, strict=True):
            if g is not None:
                s.assign_add(tf.convert_to_tensor(g))
        done = count.assign_add(1)

        def step() -> Any:
            scale = 1.0 / self._hvd_passes if self._hvd_average_aggregated else 1.0
            apply([s.read_value() * scale if p else None for s, p in zip(sums, present, strict=True)])
            for s in sums:
                s.assign(tf.zeros_like(s))
            return tf.constant(True)

        def skip() -> Any:  # Horovod's: iterations counts every call, applied or not
            self.iterations.assign_add(1)  # type: ignore[attr-defined]
            return tf.constant(False)

        return tf.cond(tf.equal(done % self._hvd_passes, 0), step, skip)

    @property
    def _agg_helper(self) -> Any:
        """Horovod's aggregation helper as scripts read it (``counter``), or None without
        ``backward_passes_per_step``."""
        return _Aggregation(self) if self._hvd_passes > 1 else None


class _Aggregation:
    """What Horovod's ``optimizer._agg_helper`` shows: ``counter``, the passes summed since the last apply."""

    def __init__(self, optimizer: _Accumulating) -> None:
        self._optimizer = optimizer

    @property
    def counter(self) -> Any:
        import tensorflow as tf

        count = self._optimizer.__dict__.get("_hvd_state", {}).get("count")
        return tf.constant(0, tf.int64) if count is None else count % self._optimizer._hvd_passes


class HorovodKeras3(_Accumulating, DistributedKeras3):
    """Mixin for Keras 3 optimizers."""

    def _hvd_build(self, variables: list[Any]) -> None:
        if not self.built:  # type: ignore[attr-defined]
            self.build(variables)  # type: ignore[attr-defined]

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if self._hvd_passes == 1:
            return super().apply(grads, trainable_variables)
        variables = list(trainable_variables if trainable_variables is not None else self._trainable_variables)  # type: ignore[attr-defined]
        parent = super()
        return self._hvd_accumulate(list(grads), variables, lambda g: parent.apply(g, variables))  # type: ignore[attr-defined]


class HorovodLegacy(_Accumulating, DistributedLegacy):
    """Mixin for tf_keras (Keras 2) optimizers."""

    def _hvd_build(self, variables: list[Any]) -> None:
        import tensorflow as tf

        with tf.init_scope():
            if hasattr(self, "_create_all_weights"):  # optimizer_v2 (legacy)
                self._create_all_weights(variables)
            elif not getattr(self, "_built", True):
                self.build(variables)  # type: ignore[attr-defined]

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None, tape: Any = None) -> Any:
        """Horovod's: the gradients of ``loss``, reduced across the ranks (local layers' kept, scaled as
        configured); with ``backward_passes_per_step`` > 1 this rank's, which ``apply_gradients`` sums and
        reduces every N calls. Pass the pairs to ``apply_gradients``, which then does not reduce again."""
        parent = super()
        if hasattr(parent, "_compute_gradients"):  # tf_keras's legacy optimizers (optimizer_v2)
            pairs = list(parent._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape))
        else:
            pairs = list(self.compute_gradients(loss, var_list, tape))  # type: ignore[attr-defined]
        if self._hvd_passes > 1:
            return pairs
        variables = [v for _, v in pairs]
        self.__dict__["_hvd_reduced"] = True
        return list(zip(self._mldist_reduce([g for g, _ in pairs], variables), variables, strict=True))

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.pop("_hvd_reduced", False):  # from _compute_gradients: reduced there
            return super(DistributedLegacy, self).apply_gradients(grads_and_vars, *args, **kwargs)  # type: ignore[misc]
        if self._hvd_passes == 1:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        parent = super()
        apply = lambda g: parent.apply_gradients(zip(g, variables, strict=True), *args, **kwargs)  # type: ignore[attr-defined]  # noqa: E731
        return self._hvd_accumulate([g for g, _ in pairs], variables, apply)


def _attrs(how: Reduction, passes: int, average_aggregated: bool) -> dict[str, Any]:
    return {"_hvd_how": how, "_hvd_passes": passes, "_hvd_average_aggregated": average_aggregated}


def _check_keras_optimizer(optimizer: Any) -> None:
    if not (hasattr(optimizer, "get_config") and hasattr(type(optimizer), "from_config")):
        raise UnsupportedError(
            f"DistributedOptimizer({type(optimizer).__name__}): mldist wraps Keras optimizers (Keras 3 or "
            "tf_keras); for tf.compat.v1 optimizers use a Keras optimizer or hvd.DistributedGradientTape"
        )
    if getattr(type(optimizer), "_mldist_distributed", False):
        raise ConfigError("this optimizer is already distributed (wrapped by mldist); wrap the plain optimizer once")


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """A Keras optimizer that reduces gradients across ranks before applying them.

    Args:
        optimizer: a Keras 3 or tf_keras optimizer (not yet used).
        compression, sparse_as_dense, op, gradient_predivide_factor: as for DistributedGradientTape.
        backward_passes_per_step: apply (and communicate) once every N calls, on the sum of N gradients.
        average_aggregated_gradients: divide that sum by N.
        scale_local_gradients: divide the gradients of local variables (``register_local_var``) by the size.
        name, device_dense, device_sparse, num_groups, groups: accepted.

    Example::

        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()), backward_passes_per_step=2)
    """
    basics.context()
    _check_keras_optimizer(optimizer)
    if not (isinstance(backward_passes_per_step, int) and backward_passes_per_step >= 1):
        raise ConfigError(f"backward_passes_per_step={backward_passes_per_step!r} must be an integer >= 1")
    how = make_reduction(op, compression, sparse_as_dense, gradient_predivide_factor, process_set)
    attrs = _attrs(how, backward_passes_per_step, bool(average_aggregated_gradients))
    attrs["_hvd_scale_local"] = bool(scale_local_gradients)
    cls: Any = distributed_class(type(optimizer), (HorovodKeras3, HorovodLegacy), attrs)
    return cls.from_config(optimizer.get_config())


def PartialDistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: Any = None,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """A :func:`DistributedOptimizer` that keeps the gradients of ``local_layers``' weights on each rank.

    The layers' weights are looked up at each step, so layers built later count too.

    Example::

        opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.01), local_layers=[model.layers[-1]])
    """
    wrapped = DistributedOptimizer(
        optimizer,
        name,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        gradient_predivide_factor,
        op,
        backward_passes_per_step,
        average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    wrapped.__dict__["_hvd_local_layers"] = list(local_layers or ())
    return wrapped


def load_model(
    filepath: str,
    custom_optimizers: Any = None,
    custom_objects: Any = None,
    compression: Any = Compression.none,
    legacy_opts: bool = False,
) -> Any:
    """Load a Keras model saved with a wrapped optimizer; its optimizer (with its state) reduces again.

    Args:
        filepath: a ``.keras`` or ``.h5`` file (the format of the Keras in use).
        custom_optimizers: optimizer classes of your own that the file names.
        custom_objects: other custom objects, as for ``keras.models.load_model``.
        compression: the compression of the restored optimizer.
        legacy_opts: accepted for Horovod's signature: the file's own optimizer class is used
            (tf_keras's under ``TF_USE_LEGACY_KERAS=1``).

    Example::

        model = hvd.load_model("checkpoint.keras")
    """
    from .keras_flavour import keras_module

    objects = dict(custom_objects or {})
    objects.update({cls.__name__: cls for cls in custom_optimizers or ()})
    model = keras_module().models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(type(optimizer), "_mldist_distributed", False):
        how = make_reduction(Average, compression, False, 1.0, None)
        # Swap the class in place: a new optimizer from its config would lose the restored slots.
        optimizer.__class__ = distributed_class(type(optimizer), (HorovodKeras3, HorovodLegacy), _attrs(how, 1, False))
    return model
