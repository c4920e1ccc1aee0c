"""Horovod's Keras callbacks at ``horovod.keras.callbacks``'s path, for the Keras in use.

Example::

    import mldist.horovod.keras as hvd
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
"""

from __future__ import annotations

from typing import Any

from ..callbacks import classes, refuse
from ..keras_flavour import keras_module

_CLASSES = classes(keras_module())
BestModelCheckpoint = _CLASSES["BestModelCheckpoint"]
BroadcastGlobalVariablesCallback = _CLASSES["BroadcastGlobalVariablesCallback"]
MetricAverageCallback = _CLASSES["MetricAverageCallback"]
LearningRateScheduleCallback = _CLASSES["LearningRateScheduleCallback"]
LearningRateWarmupCallback = _CLASSES["LearningRateWarmupCallback"]

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]


def __getattr__(name: str) -> Any:
    raise refuse(name, __name__)
