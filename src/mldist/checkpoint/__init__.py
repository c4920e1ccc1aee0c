"""Checkpoints that survive preemption: atomic, checksummed, rank 0 writes, rank 0 reads.

``format`` writes, lists, reads and verifies the ``ckpt-<step>`` directories on disk
(no TensorFlow, no other ranks); ``manager`` holds :class:`CheckpointManager`, which
saves on rank 0 and broadcasts what it restores to every rank.

Example::

    mgr = mldist.CheckpointManager("ckpt", keep=3)
    step = mgr.restore(model=model, optimizer=optimizer)   # 0 when there is none
    mgr.save(step, model=model, optimizer=optimizer)
"""

from __future__ import annotations

from .format import ModelMismatch, SaveFailed
from .manager import CheckpointManager

__all__ = ["CheckpointManager", "ModelMismatch", "SaveFailed"]
