"""``horovod.tensorflow.keras.callbacks``'s path: the same classes as ``mldist.horovod.keras.callbacks``.

Example::

    import mldist.horovod.tensorflow.keras as hvd
    cb = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.001 * hvd.size(), warmup_epochs=3)
"""

from __future__ import annotations

from typing import Any

from ...callbacks import refuse
from ...keras.callbacks import (
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]


def __getattr__(name: str) -> Any:
    raise refuse(name, __name__)
