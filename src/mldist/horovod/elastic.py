"""Horovod's elastic API: commit, and resume after a failure in the same or a re-formed world.

``state.commit()`` keeps the state in this process's memory (for ``restore``), in every
host's memory while the run is elastic (``/dev/shm``, :mod:`mldist.checkpoint.commits`:
the copies outlive the workers) and on disk (rank 0 writes ``elastic-state.pkl`` in the run
directory, atomically, owner-only; ``-2``, ``-3``, ... for later ``elastic.run`` calls),
numbered by a sequence. When a worker fails, ``mldist run --max-restarts K`` (a fixed world),
``mldist run --min-np N`` (an elastic one: it re-forms on the hosts that remain,
:mod:`mldist.launch.elastic`) or a requeued batch job starts every rank again, and
``@hvd.elastic.run`` resumes from the newest commit any rank still holds: that rank loads it,
``sync`` broadcasts it, the reset callbacks fire (rescale the learning rate to the new
``hvd.size()`` there, as Horovod's examples do), and the function is called again with the
restored state. A first start ignores commit files left by earlier runs.

Example::

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, 5):
            train_one_epoch()
            state.commit()

    train(state)
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base import envvalues, rejoin
from ..base.envparse import whole
from ..base.files import atomic_write
from ..checkpoint import commits
from ..errors import REFORM_CODE
from ..runtime import compat
from . import basics
from .common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .objects import allgather_object, broadcast_object, broadcast_variables

__all__ = [
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TensorFlowKerasState",
    "TensorFlowState",
    "restarted",
    "run",
    "state_path",
]
STATE_FILE = "elastic-state.pkl"
RESUMED = rejoin.RESUMED
LEAVING = "mldist: elastic: leaving"


def state_path(env: dict[str, str] | None = None, number: int = 1) -> Path:
    """Where the ``number``-th ``elastic.run`` of the script commits: ``MLDIST_ELASTIC_DIR``, else the
    run directory, else the current one.

    Example:
        >>> str(state_path({"MLDIST_RUN_DIR": "runs/a"})), state_path({}, 2).name
        ('runs/a/elastic-state.pkl', 'elastic-state-2.pkl')
    """
    env = dict(os.environ) if env is None else env
    name = STATE_FILE if number == 1 else STATE_FILE.replace(".pkl", f"-{number}.pkl")
    return Path(envvalues.ELASTIC_DIR.read(env) or envvalues.RUN_DIR.read(env) or ".") / name


def restarted(env: dict[str, str] | None = None) -> bool:
    """Whether this process is a restart (``mldist run --max-restarts``, a requeued Slurm job).

    Example:
        >>> restarted({"MLDIST_RESTART": "1"}), restarted({"MLDIST_RESTART": "0"})
        (True, False)
    """
    env = dict(os.environ) if env is None else env
    slurm = env.get("SLURM_RESTART_COUNT", "")
    return envvalues.RESTART.read(env) > 0 or (whole(1)(slurm) is not None)


_RUNS = [0]  # elastic.run calls in this process: each has its own commit file


class State(ABC):
    """What an elastic script keeps: commit (memory and disk), restore, sync, reset callbacks."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._path = state_path()
        self._number = 1  # which elastic.run of the script this state serves
        self._seq = 0  # commits so far, over every start of the run
        self._root = 0  # the rank sync() takes the state from: the one that loaded the newest commit

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after the state was restored from a commit (after a restart)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the state: in memory for :meth:`restore`, in this host's memory in an elastic run (its first
        worker), and on disk (rank 0) for a restarted job."""
        self.save()
        self._seq += 1
        here = commits.host_copy(os.environ, self._number)
        local_first, first = basics.local_rank() == 0 and here is not None, basics.rank() == 0
        snapshot = self.snapshot() if local_first or first else None
        if local_first and here is not None:
            commits.write(here, self._seq, snapshot)
        if first:
            atomic_write(self._path, pickle.dumps({"seq": self._seq, "state": snapshot}), mode=0o600)
        # A collective, as Horovod's commit is: no rank leaves it before rank 0 has the state on
        # disk, so a rank that dies right after its commit restarts from this commit, not the one before.
        # It carries whether hosts joined (rank 0 reads the launcher's flag): then every rank leaves here.
        if broadcast_object(basics.rank() == 0 and rejoin.raised(os.environ), root_rank=0):
            raise HostsUpdatedInterrupt(skip_sync=True)

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank when hosts joined the world (collective, as Horovod's).

        ``mldist run --host-discovery-script`` raises the flag; ``elastic.run`` then leaves so that the
        world re-forms with them, and every rank resumes from the last commit.
        """
        if broadcast_object(basics.rank() == 0 and rejoin.raised(os.environ), root_rank=0):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def resume(self, number: int = 1) -> bool:
        """After a restart, load the newest commit of the ``number``-th ``elastic.run`` that any rank
        holds (the lowest such rank loads it; :meth:`sync` spreads it); whether one was found
        (collective). A first start ignores files left by earlier runs."""
        self._path, self._number = state_path(number=number), number
        if not restarted():
            return False
        held = [(commits.read(commits.host_copy(os.environ, number)), f"in {commits.host_name(os.environ)}'s memory")]
        if basics.rank() == 0:
            held.append((commits.read(self._path), f"on disk ({self._path})"))
        found = [(got[0], got[1], where) for got, where in held if got is not None]
        seq, state, where = max(found, key=lambda f: f[0]) if found else (-1, None, "")
        seen = allgather_object((seq, where))
        root = commits.newest(seen)
        if root is None:
            return False
        if basics.rank() == root and state is not None:
            self.load(state)
            self.save()
        self._root, self._seq = root, seen[root][0]
        if basics.rank() == 0 and commits.folder(os.environ) is not None:  # elastic: the launcher times this line
            print(
                f"{RESUMED}: commit {self._seq} from rank {root}, {seen[root][1]}; {basics.size()} worker(s)",
                file=sys.stderr,
                flush=True,
            )
        return True

    @abstractmethod
    def save(self) -> None:
        """Keep the current state in memory (for :meth:`restore`)."""

    @abstractmethod
    def restore(self) -> None:
        """Go back to the last :meth:`save`."""

    @abstractmethod
    def sync(self) -> None:
        """Every rank takes the state of rank 0, or of the rank that loaded the newest commit."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """The state as picklable values (what a commit writes)."""

    @abstractmethod
    def load(self, snapshot: dict[str, Any]) -> None:
        """Take the values of a :meth:`snapshot`."""


class ObjectState(State):
    """Picklable Python values as attributes (``epoch``, ``batch``, ...), Horovod's ``ObjectState``.

    Args:
        bcast_object, get_rank: accepted for Horovod's signature.
        **kwargs: the values, e.g. ``epoch=0, batch=0``.
    """

    def __init__(self, bcast_object: Any = None, get_rank: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = copy.deepcopy(kwargs)

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._values())

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self) -> None:
        """Every rank takes the root's values (rank 0's, or the rank's that loaded the newest commit)."""
        for name, value in broadcast_object(self._values(), root_rank=self._root).items():
            setattr(self, name, value)
        self.save()

    def snapshot(self) -> dict[str, Any]:
        return {"values": self._values()}

    def load(self, snapshot: dict[str, Any]) -> None:
        for name, value in snapshot["values"].items():
            setattr(self, name, value)


class TensorFlowState(ObjectState):
    """Variables and Python values, Horovod's ``TensorFlowState``.

    Args:
        variables: the variables to keep (e.g. ``model.variables``).
        session: accepted for Horovod's signature (TensorFlow 1).
    """

    def __init__(self, variables: Any = None, session: Any = None, **kwargs: Any) -> None:
        self._variables_given = list(variables or [])
        self._held: list[Any] = []
        super().__init__(**kwargs)

    def _variables(self) -> list[Any]:
        return self._variables_given

    def save(self) -> None:
        super().save()
        self._held = [v.numpy() for v in self._variables()]

    def restore(self) -> None:
        super().restore()
        self._assign(self._held)

    def _assign(self, values: list[Any]) -> None:
        variables = self._variables()
        if len(values) == len(variables):
            for var, value in zip(variables, values, strict=True):
                var.assign(value)

    def sync(self) -> None:
        if self._variables():
            broadcast_variables(self._variables(), root_rank=self._root)
        super().sync()

    def snapshot(self) -> dict[str, Any]:
        return super().snapshot() | {"variables": [v.numpy() for v in self._variables()]}

    def load(self, snapshot: dict[str, Any]) -> None:
        super().load(snapshot)
        self._assign(snapshot["variables"])


class TensorFlowKerasState(TensorFlowState):
    """A Keras model, its optimizer and Python values, Horovod's ``TensorFlowKerasState`` (``KerasState``).

    Args:
        model: the Keras model; ``state.model`` afterwards.
        optimizer: its optimizer (default ``model.optimizer``); its slots are kept once it has built them.
        backend: accepted for Horovod's signature.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(**kwargs)

    def _variables(self) -> list[Any]:
        from .callbacks import _optimizer_variables

        optimizer = self.optimizer or getattr(self.model, "optimizer", None)
        return list(self.model.weights) + (_optimizer_variables(optimizer) if optimizer is not None else [])

    def sync(self) -> None:
        """Every rank takes rank 0's weights, optimizer slots (built everywhere if rank 0 has them) and values."""
        optimizer = self.optimizer or getattr(self.model, "optimizer", None)
        if optimizer is not None and broadcast_object(_built(optimizer), root_rank=self._root):
            _build(optimizer, self.model)
        super().sync()

    def _assign(self, values: list[Any]) -> None:
        weights = list(self.model.weights)
        self.model.set_weights(values[: len(weights)])
        optimizer = self.optimizer or getattr(self.model, "optimizer", None)
        rest = values[len(weights) :]
        if optimizer is not None and rest:
            _build(optimizer, self.model)
            super()._assign(values)  # all variables at once, now that the optimizer's exist


def _built(optimizer: Any) -> bool:
    """Whether the optimizer has made its variables (Keras 3, tf_keras and its legacy optimizers alike)."""
    for flag in ("built", "_built"):  # Keras 3; tf_keras (set by its build)
        if isinstance(getattr(optimizer, flag, None), bool):
            return bool(getattr(optimizer, flag))
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras's legacy optimizers: slots exist once made
        from .callbacks import _optimizer_variables

        return len(_optimizer_variables(optimizer)) > 1
    return False


def _build(optimizer: Any, model: Any) -> None:
    """Create the optimizer's slots (a restored state carries them before the first step has)."""
    if _built(optimizer):
        return
    compat.build_optimizer(optimizer, list(model.trainable_variables))


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``@hvd.elastic.run``: resume from the last commit (after a restart), sync, then call.

    Example::

        @hvd.elastic.run
        def train(state): ...
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        _RUNS[0] += 1
        resumed = state.resume(_RUNS[0])
        state.sync()
        state._root = 0
        if resumed:
            state.on_reset()
        try:
            out = func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            if basics.rank() == 0:
                print(f"{LEAVING} at commit {state._seq}: hosts joined the world", file=sys.stderr, flush=True)
            sys.stdout.flush()
            raise SystemExit(REFORM_CODE) from None
        broadcast_object(None, root_rank=0)  # every rank is done with the commits before they go
        if basics.local_rank() == 0:
            commits.remove(commits.host_copy(os.environ, _RUNS[0]))
        return out

    return wrapper
