"""Keras helpers: the distributed optimizer and callbacks for ``model.fit``.

Example::

    import keras, mldist, mldist.keras
    mldist.init()
    opt = mldist.keras.DistributedOptimizer(keras.optimizers.Adam(mldist.keras.scale_lr(1e-3)))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(ds, epochs=5, callbacks=mldist.keras.default_callbacks())
"""

from __future__ import annotations

from ..runtime import average_gradients
from .callbacks import (
    AverageMetrics,
    BroadcastInitialState,
    LearningRateWarmup,
    StallWatch,
    default_callbacks,
    scale_lr,
)
from .checkpoint import Checkpoint, single_process
from .elastic import Elastic
from .optimizer import DistributedOptimizer
from .profile import ProfileSteps
from .runlog import RunLog

__all__ = [
    "AverageMetrics",
    "BroadcastInitialState",
    "Checkpoint",
    "DistributedOptimizer",
    "Elastic",
    "LearningRateWarmup",
    "ProfileSteps",
    "RunLog",
    "StallWatch",
    "average_gradients",
    "default_callbacks",
    "scale_lr",
    "single_process",
]
