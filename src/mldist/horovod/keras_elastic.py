"""``horovod.tensorflow.keras.elastic``: Horovod's elastic Keras state and callbacks on mldist.

``KerasState`` is :class:`mldist.horovod.elastic.TensorFlowKerasState`; the callbacks keep
``state.batch`` and ``state.epoch`` current and commit every ``batches_per_commit`` batches.

Example::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state)]
"""

from __future__ import annotations

from typing import Any

from .elastic import ObjectState, State, TensorFlowKerasState, TensorFlowState, run
from .keras_flavour import keras_module

KerasState = TensorFlowKerasState
_Callback: Any = keras_module().callbacks.Callback


class CommitStateCallback(_Callback):  # type: ignore[misc]
    """Commit ``state`` every ``batches_per_commit`` batches (as Horovod's: a restart repeats the
    batches since the last commit; commit after updating ``state.epoch`` for exact resumes)."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state, self.batches_per_commit, self.seen = state, batches_per_commit, 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen += 1
        if self.seen % self.batches_per_commit == 0:
            self.state.commit()


class UpdateBatchStateCallback(_Callback):  # type: ignore[misc]
    """Keep ``state.batch`` at the batches done in this epoch (0 at an epoch's end)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch + 1  # type: ignore[attr-defined]

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0  # type: ignore[attr-defined]


class UpdateEpochStateCallback(_Callback):  # type: ignore[misc]
    """Keep ``state.epoch`` at the epochs done (counted across restarts)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state, self.start = state, None

    def on_train_begin(self, logs: Any = None) -> None:
        self.start = self.state.epoch  # type: ignore[attr-defined]  # fit's epochs count from 0 again

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = (self.start or 0) + epoch + 1  # type: ignore[attr-defined]


__all__ = [
    "CommitStateCallback",
    "KerasState",
    "ObjectState",
    "TensorFlowKerasState",
    "TensorFlowState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
