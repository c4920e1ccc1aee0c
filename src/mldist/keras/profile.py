"""``ProfileSteps``: the timeline of chosen training steps on every rank (``mldist.runtime.collect.profiling``).

TensorFlow's profiler on KERAS_BACKEND=tensorflow, JAX's on KERAS_BACKEND=jax.

In ``default_callbacks()``; it does nothing unless ``MLDIST_PROFILE_STEPS`` is set
(``mldist run --profile-steps A:B``). Steps count train batches across epochs, from 0.

Example::

    model.fit(ds, epochs=2, callbacks=[mldist.keras.ProfileSteps(first=10, last=12)])
"""

from __future__ import annotations

from typing import Any

import keras

from ..runtime.collect.profiling import StepProfiler, trace_dir


class ProfileSteps(keras.callbacks.Callback):  # type: ignore[misc]
    """Record train steps ``first``..``last`` (default: from ``MLDIST_PROFILE_STEPS``) and merge the trace.

    Args:
        first, last: steps to record, both included; None for both: from the environment.
    """

    def __init__(self, first: int | None = None, last: int | None = None) -> None:
        super().__init__()
        import os

        if first is None or last is None:
            self.profiler = StepProfiler.from_env()
        else:
            self.profiler = StepProfiler(first, last, trace_dir(os.environ))
        self.step = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.profiler is not None:
            self.profiler.begin(self.step)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.profiler is not None:
            self.profiler.end(self.step)
        self.step += 1
