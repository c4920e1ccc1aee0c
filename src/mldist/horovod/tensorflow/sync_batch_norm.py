"""``horovod.tensorflow.sync_batch_norm``'s path (see :mod:`mldist.horovod.sync_batch_norm`)."""

from ..sync_batch_norm import SyncBatchNormalization

__all__ = ["SyncBatchNormalization"]
