"""``horovod.tensorflow.elastic``'s path (see :mod:`mldist.horovod.elastic`)."""

from ..elastic import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    TensorFlowKerasState,
    TensorFlowState,
    run,
)

__all__ = [
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TensorFlowKerasState",
    "TensorFlowState",
    "run",
]
