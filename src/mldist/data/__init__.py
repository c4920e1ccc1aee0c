"""Input for data-parallel training: sharded ``tf.data`` pipelines and datasets for offline clusters.

``sharding`` gives every rank the same number of full batches (``shard``,
``shard_files``; resumable through ``Stream``); ``datasets`` fetches a dataset once
on a login node (``mldist data fetch``) and loads it from the cache in the job
(``load``).

Example::

    (x, y), _ = mldist.data.load("mnist")
    ds = mldist.data.shard(tf.data.Dataset.from_tensor_slices((x, y)), batch_size=64)
    model.fit(ds, epochs=5)
"""

from __future__ import annotations

from .datasets import load
from .sharding import STREAMS as STREAMS  # the live streams, whose positions mldist.keras.Checkpoint saves
from .sharding import Stream, equal_steps, shard, shard_files

__all__ = ["Stream", "equal_steps", "load", "shard", "shard_files"]
