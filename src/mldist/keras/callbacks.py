"""Keras callbacks for data-parallel training.

Put them first in ``callbacks=``: Keras runs callbacks in list order, so
metrics averaged here are what EarlyStopping, ReduceLROnPlateau and
checkpoints see, and every rank takes the same decision.

Example::

    model.fit(ds, epochs=10, callbacks=[*mldist.keras.default_callbacks(), EarlyStopping()])
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

from .. import runtime
from ..errors import ConfigError
from ..runtime import allgather, allreduce, broadcast, compat

RULES = ("linear", "sqrt")


def quiet_unless_chief() -> None:
    """Progress bars and Keras messages only on rank 0."""
    if not runtime.init().is_chief:
        keras.config.disable_interactive_logging()


def scale_lr(lr: float, rule: str = "linear", size: int | None = None) -> float:
    """Learning rate for ``size`` workers (default: the world size).

    Args:
        lr: the single-worker learning rate.
        rule: "linear" (Goyal et al. 2017) or "sqrt".
        size: number of workers; default ``mldist.size()``.

    Example::

        keras.optimizers.SGD(scale_lr(0.1))     # 0.4 on 4 workers
    """
    if rule not in RULES:
        raise ConfigError(f"rule={rule!r} is not one of {', '.join(RULES)}")
    n = size if size is not None else runtime.init().size
    if n < 1:
        raise ConfigError(f"size={n} must be at least 1")
    return lr * n if rule == "linear" else lr * math.sqrt(n)


def check_equal_steps(steps: int | None) -> None:
    """Raise on every rank, naming each rank's count, if steps per epoch differ.

    A rank with one step more would wait forever in a collective.
    """
    counts = np.asarray(allgather(np.array([-1 if steps is None else int(steps)], np.int64))).tolist()
    if len(set(counts)) > 1:
        listed = ", ".join(f"rank {r}: {'unknown' if c < 0 else c}" for r, c in enumerate(counts))
        raise ConfigError(
            f"steps per epoch differ between workers ({listed}); shard the input with "
            "mldist.data.shard(...) or pass the same steps_per_epoch= on every rank"
        )


class BroadcastInitialState(keras.callbacks.Callback):  # type: ignore[misc]
    """At the start of training every rank takes rank ``root``'s weights and optimizer state.

    Workers then need not share a seed. Runs once per callback instance.

    Args:
        root: the rank whose state wins.
    """

    def __init__(self, root: int = 0) -> None:
        super().__init__()
        self.root = root
        self.done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        quiet_unless_chief()
        if runtime.init().size == 1:
            return
        check_equal_steps(self.params.get("steps"))
        if self.done:
            return
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            variables += list(optimizer.variables)
        values = broadcast([v.value for v in variables], root=self.root)
        for var, value in zip(variables, values, strict=True):
            var.assign(value)
        self.done = True


class AverageMetrics(keras.callbacks.Callback):  # type: ignore[misc]
    """Average epoch metrics (training and ``val_``) over all workers, in place.

    Later callbacks, History and the progress bar see the averages.
    """

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        quiet_unless_chief()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs or runtime.init().size == 1:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, int | float))
        means = allreduce(np.array([float(logs[k]) for k in keys], np.float64), "mean")
        for key, value in zip(keys, np.asarray(means).tolist(), strict=True):
            logs[key] = value


@keras.saving.register_keras_serializable(package="mldist")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
    """A learning-rate schedule scaled from ``1 / size`` to 1 over its first ``steps`` steps.

    What :class:`LearningRateWarmup` puts around an optimizer's own schedule: the rate at
    step ``s`` is ``schedule(s) * (1/size + (1 - 1/size) * min(s / steps, 1))``, so the
    warm-up and the schedule compose, as Horovod's warm-up and schedule callbacks do.

    Args:
        schedule: the optimizer's schedule.
        steps: warm-up length in optimizer steps.
        size: the number of workers.

    Example::

        WarmupSchedule(keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9), steps=50, size=4)
    """

    def __init__(self, schedule: Any, steps: int, size: int) -> None:
        super().__init__()
        self.schedule, self.steps, self.size = schedule, int(steps), int(size)

    def __call__(self, step: Any) -> Any:
        rate = keras.ops.convert_to_tensor(self.schedule(step))
        if self.steps <= 0 or self.size <= 1:
            return rate
        done = keras.ops.minimum(keras.ops.cast(step, rate.dtype) / self.steps, 1.0)
        return rate * (1.0 / self.size + (1.0 - 1.0 / self.size) * done)

    def get_config(self) -> dict[str, Any]:
        """Serializable with the model (the wrapped schedule included)."""
        return {"schedule": keras.saving.serialize_keras_object(self.schedule), "steps": self.steps, "size": self.size}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WarmupSchedule:
        """The schedule :meth:`get_config` described."""
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["steps"], config["size"])


class LearningRateWarmup(keras.callbacks.Callback):  # type: ignore[misc]
    """Ramp the learning rate from ``lr / size`` to ``lr`` (Goyal et al. 2017).

    The step count comes from the optimizer's ``iterations``, so a resumed
    run continues the ramp where it stopped. An optimizer whose rate is a
    ``keras.optimizers.schedules.LearningRateSchedule`` keeps it: during ``fit``
    the schedule is wrapped in a :class:`WarmupSchedule`, which scales the
    schedule's own rate the same way, and unwrapped when ``fit`` ends.

    Args:
        warmup_epochs: ramp length in epochs (uses the fit's steps per epoch).
        warmup_steps: ramp length in optimizer steps (instead of epochs).
        target_lr: the final rate; default the optimizer's rate at the start (not with a schedule).
        verbose: print the rate at the end of the warm-up (rank 0).

    Example::

        LearningRateWarmup(warmup_epochs=5)
        opt = keras.optimizers.SGD(keras.optimizers.schedules.CosineDecay(0.4, 10_000))
        model.compile(opt, ...); model.fit(ds, callbacks=[LearningRateWarmup(warmup_steps=500)])
    """

    def __init__(
        self,
        warmup_epochs: float | None = None,
        warmup_steps: int | None = None,
        target_lr: float | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        if (warmup_epochs is None) == (warmup_steps is None):
            raise ConfigError("give exactly one of warmup_epochs= or warmup_steps=")
        if (warmup_epochs or 0) < 0 or (warmup_steps or 0) < 0:
            raise ConfigError("the warm-up length cannot be negative")
        self.warmup_epochs = warmup_epochs
        self.warmup_steps = warmup_steps
        self.target_lr = target_lr
        self.verbose = verbose
        self._total = warmup_steps or 0
        self._size = 1
        self._wrapped: WarmupSchedule | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._size = runtime.init().size
        opt = self.model.optimizer
        if self.warmup_steps is not None:
            self._total = self.warmup_steps
        else:
            steps = self.params.get("steps") or 0
            if not steps:
                raise ConfigError("warmup_epochs needs a known number of steps per epoch; use warmup_steps=")
            self._total = round(float(self.warmup_epochs or 0) * steps)
        if compat.learning_rate_is_schedule(opt):
            self._wrap_schedule(opt)
        elif self.target_lr is None:
            self.target_lr = float(keras.ops.convert_to_numpy(opt.learning_rate))

    def _wrap_schedule(self, opt: Any) -> None:
        if self.target_lr is not None:
            raise ConfigError(
                f"LearningRateWarmup(target_lr={self.target_lr:g}) with a learning-rate schedule: the warm-up "
                "scales the schedule's own rate; leave target_lr out"
            )
        schedule = opt._learning_rate  # the public learning_rate gives the current value, not the schedule
        if isinstance(schedule, WarmupSchedule):  # a fit that did not end (an exception): wrap the original again
            schedule = schedule.schedule
        self._wrapped = WarmupSchedule(schedule, self._total, self._size)
        opt.learning_rate = self._wrapped  # Keras's setter takes a schedule

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._wrapped is not None and self.model.optimizer._learning_rate is self._wrapped:
            self.model.optimizer.learning_rate = self._wrapped.schedule  # saved models keep the user's schedule
        self._wrapped = None

    def lr_at(self, step: int) -> float:
        """The rate for optimizer step ``step`` (0-based) of a constant rate."""
        assert self.target_lr is not None
        if step >= self._total:
            return self.target_lr
        start = self.target_lr / self._size
        return start + (self.target_lr - start) * step / self._total

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if step > self._total:
            return
        if self._wrapped is None:
            self.model.optimizer.learning_rate = self.lr_at(step)
        if self.verbose and step == self._total and runtime.init().is_chief:
            reached = "the schedule's rate" if self._wrapped is not None else f"learning rate {self.target_lr:g}"
            print(f"\nLearningRateWarmup: reached {reached} at step {step}")


class StallWatch(keras.callbacks.Callback):  # type: ignore[misc]
    """Time whole training steps that XLA compiles, whose collectives cannot be timed one by one.

    On GPUs, and always on KERAS_BACKEND=jax, Keras compiles steps with XLA (``jit_compile``), and
    the collectives inside a compiled step give the watch no marks; a stalled all-reduce would hang
    the job. So each step after the first (which compiles) counts as one collective for
    ``MLDIST_COLLECTIVE_TIMEOUT``: from the moment Keras calls the step (after every callback's
    ``on_train_batch_begin``) to this callback's ``on_train_batch_end``. Uncompiled steps are
    watched collective by collective.

    Example::

        model.fit(ds, callbacks=[mldist.keras.StallWatch()])  # in default_callbacks already
    """

    #: How a compiled step is named in stall lines and ``mldist stacks``.
    STEP = "a training step compiled by XLA"

    def __init__(self) -> None:
        super().__init__()
        self._token: int | None = None
        self._steps = 0
        self._inner: Any = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Mark each call of the model's step function (Keras made it before this hook)."""
        from ..runtime.watch import stall

        inner = getattr(self.model, "train_function", None)
        # A fit that raised never ran on_train_end: take Keras's own function from under an old wrapper.
        inner = getattr(inner, "_mldist_inner", inner)
        if inner is None or not stall.active() or getattr(self.model, "jit_compile", False) is not True:
            return

        def marked(*args: Any, **kwargs: Any) -> Any:
            if self._steps and self._token is None:
                self._token = stall.begin(self.STEP)
            return inner(*args, **kwargs)

        marked._mldist_inner = inner  # type: ignore[attr-defined]
        self._inner, self.model.train_function = inner, marked

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        from ..runtime.watch import stall

        stall.step()  # the slow-rank line says its cost per step (mldist.runtime.watch.straggler)
        if self._token is not None:
            stall.end(self._token)
            self._token = None
        self._steps += 1

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Give the model its own step function back."""
        if self._inner is not None:
            self.model.train_function, self._inner = self._inner, None


def default_callbacks(root: int = 0) -> list[keras.callbacks.Callback]:
    """The callbacks every data-parallel ``fit`` wants, in the right order.

    Example::

        model.fit(ds, callbacks=[*mldist.keras.default_callbacks(), my_callback])
    """
    from .profile import ProfileSteps
    from .runlog import RunLog

    # RunLog after AverageMetrics: it logs the averaged metrics.
    return [BroadcastInitialState(root), AverageMetrics(), RunLog(), ProfileSteps(), StallWatch()]
