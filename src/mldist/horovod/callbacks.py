"""Horovod's Keras callbacks, built on the Callback class of the Keras in use (Keras 3 or tf_keras).

``classes(keras)`` makes them once per Keras package; the modules at Horovod's
paths (``mldist.horovod.keras.callbacks``, ``mldist.horovod.tensorflow.keras.callbacks``)
export them by name.

Example::

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.001 * hvd.size(), warmup_epochs=3),
    ]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, UnsupportedError
from . import basics
from .objects import broadcast_variables
from .ops import reduce_dense


def _optimizer_variables(optimizer: Any) -> list[Any]:
    found = optimizer.variables  # a list in Keras 3, a method in tf_keras
    return list(found() if callable(found) else found)


def broadcast_model(model: Any, root_rank: int, local: Any = None) -> None:
    """Give every rank ``root_rank``'s weights and optimizer state (dropout seeds stay per rank).

    ``local``: variables each rank keeps its own (Horovod's ``local_variables``).
    """
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        variables += _optimizer_variables(optimizer)
    keep = {id(v) for v in local or ()}
    broadcast_variables([v for v in variables if id(v) not in keep], root_rank)


def average_logs(logs: dict[str, Any]) -> None:
    """Replace each numeric value in ``logs`` by its mean over ranks (same keys on every rank)."""
    import tensorflow as tf

    keys = sorted(k for k, v in logs.items() if isinstance(v, int | float) or hasattr(v, "numpy"))
    if not keys or basics.size() == 1:
        return
    values = tf.constant([float(logs[k]) for k in keys], tf.float64)
    (mean,) = reduce_dense([values], basics.Average, 1.0, 1.0, _none())
    for k, v in zip(keys, mean.numpy().tolist(), strict=True):
        logs[k] = v


def _none() -> Any:
    from .compression import Compression

    return Compression.none


def _get_lr(optimizer: Any) -> float:
    return float(optimizer.learning_rate.numpy())


def _set_lr(optimizer: Any, value: float) -> None:
    lr = optimizer.learning_rate
    if not hasattr(lr, "assign"):
        raise ConfigError("the optimizer's learning rate is a schedule; Horovod's LR callbacks need a float rate")
    lr.assign(value)


def _change_lr(optimizer: Any, new: float, momentum_correction: bool) -> float | None:
    """Set the rate; with momentum correction, scale a momentum variable too and return its old value."""
    old = _get_lr(optimizer)
    _set_lr(optimizer, new)
    momentum: Any = getattr(optimizer, "momentum", None)
    if not (momentum_correction and hasattr(momentum, "assign") and old > 0):
        return None  # only a momentum held in a variable can change after tracing (legacy optimizers)
    kept = float(momentum.numpy())
    momentum.assign(kept * new / old)
    return kept


_NO_MOMENTUM: float | None = None


def _schedule_class(base: type) -> type:
    class LearningRateScheduleCallback(base):  # type: ignore[misc, valid-type]
        """Set lr = initial_lr * multiplier(epoch) in [start_epoch, end_epoch) (Horovod's arguments).

        Args:
            multiplier: a number, or a function of the epoch (fractional unless ``staircase``).
            momentum_correction: scale a momentum variable with the rate change, for one step.
            steps_per_epoch: batches per epoch (default: what ``fit`` says).
        """

        def __init__(
            self,
            initial_lr: float,
            multiplier: float | Callable[[float], float],
            start_epoch: int = 0,
            end_epoch: int | None = None,
            staircase: bool = True,
            momentum_correction: bool = True,
            steps_per_epoch: int | None = None,
            verbose: int = 0,
        ) -> None:
            super().__init__()
            self.initial_lr, self.start_epoch, self.end_epoch = float(initial_lr), start_epoch, end_epoch
            self.multiplier = multiplier if callable(multiplier) else (lambda _epoch, m=multiplier: m)
            self.staircase, self.momentum_correction = staircase, momentum_correction
            self.steps_per_epoch, self.verbose = steps_per_epoch, verbose
            self.current_epoch, self._restore_momentum = 0, _NO_MOMENTUM

        def _active(self, epoch: float) -> bool:
            return self.start_epoch <= epoch and (self.end_epoch is None or epoch < self.end_epoch)

        def _adjust(self, epoch: float) -> None:
            new = self.initial_lr * self.multiplier(epoch)
            self._restore_momentum = _change_lr(self.model.optimizer, new, self.momentum_correction)

        def on_train_begin(self, logs: Any = None) -> None:
            self.steps_per_epoch = self.steps_per_epoch or self.params.get("steps")
            if not self.staircase and not self.steps_per_epoch:
                raise ConfigError("this LR callback needs steps_per_epoch= (fit did not say how many steps)")

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.current_epoch = epoch
            if self.staircase and self._active(epoch):
                self._adjust(epoch)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            epoch = self.current_epoch + batch / float(self.steps_per_epoch or 1)
            if not self.staircase and self._active(epoch):
                self._adjust(epoch)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self._restore_momentum is not None:  # the corrected momentum was for one step only
                self.model.optimizer.momentum.assign(self._restore_momentum)
                self._restore_momentum = None

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if logs is not None:
                logs["lr"] = _get_lr(self.model.optimizer)  # history, CSVLogger and TensorBoard show it

    return LearningRateScheduleCallback


def _warmup_class(schedule: type) -> type:
    class LearningRateWarmupCallback(schedule):  # type: ignore[misc, valid-type]
        """Ramp the rate from initial_lr / size to initial_lr over warmup_epochs (Goyal et al.), per batch.

        Args:
            initial_lr: the rate after warm-up (usually the base rate times hvd.size()).
            warmup_epochs: epochs of warm-up.
            momentum_correction, steps_per_epoch: as for LearningRateScheduleCallback.
            verbose: 1 prints when warm-up ends (rank 0).
        """

        def __init__(
            self,
            initial_lr: float,
            warmup_epochs: int = 5,
            momentum_correction: bool = True,
            steps_per_epoch: int | None = None,
            verbose: int = 0,
        ) -> None:
            n, self.warmup_epochs = basics.size(), warmup_epochs

            def ramp(epoch: float) -> float:
                # Counted at the end of the batch (Horovod's rule): the last warm-up batch reaches 1.
                epoch += 1.0 / float(self.steps_per_epoch or 1)
                return (epoch * (n - 1) / warmup_epochs + 1) / n

            super().__init__(initial_lr, ramp, 0, warmup_epochs, False, momentum_correction, steps_per_epoch, verbose)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            super().on_epoch_end(epoch, logs)
            if epoch == self.warmup_epochs - 1 and self.verbose and basics.rank() == 0:
                lr = _get_lr(self.model.optimizer)
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")

    return LearningRateWarmupCallback


def _best_checkpoint_class(keras: Any) -> type:
    class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):  # type: ignore[misc, name-defined]
        """Keep the best model so far (by ``monitor``) at ``filepath``, written by rank 0 only.

        Horovod's signature, plus ``filepath`` (Horovod's estimators set it for you).
        """

        def __init__(
            self,
            monitor: str = "val_loss",
            verbose: int = 0,
            mode: str = "auto",
            save_freq: Any = "epoch",
            filepath: str = "best.keras",
        ) -> None:
            super().__init__(
                filepath, monitor=monitor, verbose=verbose, save_best_only=True, mode=mode, save_freq=save_freq
            )

        def _save_model(self, *args: Any, **kwargs: Any) -> None:
            if basics.rank() == 0:
                super()._save_model(*args, **kwargs)

    return BestModelCheckpoint


@functools.cache
def classes(keras: Any) -> dict[str, type]:
    """Horovod's callback classes on ``keras.callbacks.Callback``, by name."""
    base = keras.callbacks.Callback

    class BroadcastGlobalVariablesCallback(base):  # type: ignore[misc, valid-type]
        """Start every rank from ``root_rank``'s weights and optimizer state (again after the first batch,
        when a lazily built model or optimizer has just made its variables)."""

        def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
            super().__init__()
            self.root_rank, self.done, self.local = root_rank, False, list(local_variables or ())

        def on_train_begin(self, logs: Any = None) -> None:
            if self.model.built:
                broadcast_model(self.model, self.root_rank, self.local)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if not self.done:
                broadcast_model(self.model, self.root_rank, self.local)
                self.done = True

    class MetricAverageCallback(base):  # type: ignore[misc, valid-type]
        """Average the epoch's metrics over ranks; put it before callbacks that read them."""

        def __init__(self, device: str = "") -> None:
            super().__init__()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if logs is not None:
                average_logs(logs)

    schedule = _schedule_class(base)
    return {
        "BestModelCheckpoint": _best_checkpoint_class(keras),
        "BroadcastGlobalVariablesCallback": BroadcastGlobalVariablesCallback,
        "MetricAverageCallback": MetricAverageCallback,
        "LearningRateScheduleCallback": schedule,
        "LearningRateWarmupCallback": _warmup_class(schedule),
    }


#: Horovod callbacks mldist does not provide, with what to use instead.
REFUSED: dict[str, str] = {}


def refuse(name: str, module: str) -> UnsupportedError | AttributeError:
    """The error for a missing name in a Horovod-path callbacks module."""
    if name in REFUSED:
        return UnsupportedError(f"hvd.callbacks.{name} is not provided by mldist: {REFUSED[name]}")
    return AttributeError(f"module {module!r} has no attribute {name!r}")
