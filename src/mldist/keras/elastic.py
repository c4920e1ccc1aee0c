"""``mldist.keras.Elastic``: ``fit`` in a world that loses hosts and goes on (``mldist run --min-np``).

When a host is lost, ``mldist run`` starts the workers again on the hosts that remain
(:mod:`mldist.launch.elastic`); this callback makes ``fit`` go on from the last commit.
It is :class:`mldist.keras.Checkpoint` with two differences: the first worker of every host
keeps each commit in that host's memory too (``/dev/shm``, owner-only: they outlive the
workers, :mod:`mldist.checkpoint.commits`), and on resume the lowest rank that holds the
newest commit of all reads it; rank 0's copy on disk (the run directory's ``elastic/``) is
the last resort. In a world of another size the data is sharded for it (``mldist.data.shard``
streams start the interrupted epoch over, steps per epoch follow the new world), and with
``lr=`` the learning rate is set again for it as ``scale_lr(lr, rule)`` would set it (the
commit holds the old world's rate).

Example::

    opt = keras.optimizers.SGD(mldist.keras.scale_lr(0.01))
    model.fit(mldist.data.shard(ds), epochs=10,
              callbacks=[*mldist.keras.default_callbacks(), mldist.keras.Elastic(lr=0.01)])
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .. import runtime
from ..base import envvalues, rejoin
from ..checkpoint import commits
from ..errors import REFORM_CODE
from .callbacks import scale_lr
from .checkpoint import Checkpoint, _say

RESUMED = rejoin.RESUMED


class Elastic(Checkpoint):
    """Commit ``fit``'s state every epoch (or N steps) in every host's memory and on disk; resume from the newest.

    Args:
        directory: rank 0's copy on disk (default: the run directory's ``elastic/``, else ``./elastic``).
        commit_every: ``"epoch"``, or a number of steps.
        lr: the single-worker learning rate the script gave ``scale_lr``; after a resume in a world of
            another size the optimizer's rate becomes ``scale_lr(lr, rule)`` for it. None: left as restored.
        rule: ``scale_lr``'s rule ("linear" or "sqrt").
        keep: commits kept in each place.
        check_every: steps between preemption checks (as :class:`Checkpoint`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        commit_every: str | int = "epoch",
        *,
        lr: float | None = None,
        rule: str = "linear",
        keep: int = 2,
        check_every: int = 10,
    ) -> None:
        run_dir = envvalues.RUN_DIR.read(os.environ)
        where = directory if directory is not None else Path(run_dir) / "elastic" if run_dir else "elastic"
        super().__init__(where, save_freq=commit_every, keep=keep, final_model=None, check_every=check_every)
        scale_lr(1.0, rule, size=1)  # a wrong rule fails here, not after the first loss
        self.lr, self.rule = lr, rule
        host = commits.folder(os.environ)
        if host is not None:
            self.manager.copies = host / f"{commits.host_name(os.environ)}-keras"

    def _restore(self) -> None:
        super()._restore()
        if not self.restored_step:
            return
        size = runtime.size()
        if self.lr is not None and self.manager.restored_extra.get("size") != size:
            rate: Any = getattr(self.model.optimizer, "learning_rate", None)
            value = scale_lr(self.lr, self.rule, size)
            if hasattr(rate, "assign"):
                rate.assign(value)
                _say(f"learning rate {value:g} for {size} workers (scale_lr({self.lr:g}, {self.rule!r}))")
            else:
                _say(f"the learning rate is a schedule: set it for {size} workers in the script (lr= applies to rates)")
        if runtime.is_chief() and self.manager.copies is not None:  # the launcher times this line
            print(
                f"{RESUMED}: step {self.restored_step} from {self.manager.restored_from}; {size} worker(s)",
                file=sys.stderr,
                flush=True,
            )

    def _save(self) -> None:
        """Commit; then, when hosts joined the world (the launcher's flag, rank 0 reads it), every rank leaves
        with REFORM_CODE so that the world re-forms with them and resumes from this commit."""
        super()._save()
        flagged = np.array([1 if runtime.is_chief() and rejoin.raised(os.environ) else 0], np.int32)
        if runtime.size() > 1:
            flagged = np.asarray(runtime.broadcast(flagged, root=0))
        if int(flagged[0]):
            _say(f"elastic: leaving at step {self._step}: hosts joined the world")
            sys.stdout.flush()
            raise SystemExit(REFORM_CODE)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """After a whole fit: this host's copies go (rank 0's on disk stay)."""
        super().on_train_end(logs)
        copies = self.manager.copies
        if copies is not None and runtime.local_rank() == 0:
            shutil.rmtree(copies, ignore_errors=True)
            with contextlib.suppress(OSError):
                copies.parent.rmdir()
