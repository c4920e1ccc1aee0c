"""The process-wide context of a worker: what ``init`` found, and what it started.

Everything else in the runtime reads from here (the rank for messages, the
engine to call, the strategy the TensorFlow engine runs on), so nothing needs
to import ``init``'s module to learn it.

Example::

    ctx = current()          # None before mldist.init()
    ctx = context()          # raises RuntimeStateError before mldist.init()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base import envvalues
from ..errors import RuntimeStateError
from ..placement.engines import Decision, Handed
from ..placement.handed import handed_in
from ..placement.resources import ThreadPlan


@dataclass(frozen=True)
class Settings:
    """This worker's values of the launcher-worker contract that ``init`` and the runtime use, read once.

    Args:
        collective_timeout: seconds a collective may take before the watch ends the job (0: no watch).
        run_dir: the run directory, or None.
        restart: how many times the group was started again before this start.
        handed: the launcher's engine decision (``MLDIST_DECISION``, decoded here once), or None.

    Example:
        >>> Settings.read({"MLDIST_COLLECTIVE_TIMEOUT": "20", "MLDIST_RESTART": "1"})
        Settings(collective_timeout=20.0, run_dir=None, restart=1, handed=None)
    """

    collective_timeout: float
    run_dir: str | None
    restart: int
    handed: Handed | None = None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> Settings:
        """From ``env``, through the table (:mod:`mldist.base.envvalues`); a bad value is a ConfigError."""
        timeout, run_dir = envvalues.COLLECTIVE_TIMEOUT.read(env), envvalues.RUN_DIR.read(env)
        return cls(timeout, run_dir, envvalues.RESTART.read(env), handed_in(env))


@dataclass(frozen=True)
class Context:
    """What ``init`` found and set for this process.

    Args:
        rank, size, local_rank, local_size: place in the job.
        launcher: detected launcher name.
        workers: ``host:port`` of every rank (empty with one worker).
        threads: the thread plan applied.
        gpu: index of the pinned GPU among those visible, or None.
        decision: the engine decision (:func:`mldist.placement.engines.decide`): engine,
            Keras backend, why, and the MPI library; ``communication``, ``backend`` and
            ``mpi_library`` read it.
        settings: the contract's values this worker runs with (timeout, run directory, restart count).
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str
    workers: tuple[str, ...]
    threads: ThreadPlan
    gpu: int | None
    decision: Decision
    settings: Settings = Settings(0.0, None, 0)

    @property
    def is_chief(self) -> bool:
        """True on rank 0, the rank that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def communication(self) -> str:
        """The engine of 2+ workers ("mpi", "ring", "nccl" or "jax"), else "none"."""
        return self.decision.name

    @property
    def backend(self) -> str:
        """Keras's backend, "tensorflow" or "jax"."""
        return self.decision.backend

    @property
    def mpi_library(self) -> str:
        """The MPI library's version line when the engine is "mpi", else ""."""
        return self.decision.library


class _State:
    """The one instance of what ``init`` set; module attributes would need ``global`` everywhere."""

    ctx: Context | None = None
    #: The tf.distribute strategy (TensorFlow's engines, or one made later by ``mldist.strategy()``).
    strategy: Any = None
    #: The started engine (see ``engine.Engine``), or None with one worker.
    engine: Any = None
    #: The contract's values, read once by ``init`` before anything starts.
    settings: Settings | None = None
    #: The collective watch (:class:`mldist.runtime.watch.stall.Watch`; its slow-rank watchers registered with
    #: it), or None: off, or one worker. Typed loosely: this floor imports nothing above it.
    watch: Any = None
    #: What counts the main thread as in a collective nothing marks (the JAX engine's
    #: :class:`mldist.runtime.watch.jax_watch.Waits`), handed to the watch whenever it starts.
    sampler: Any = None


STATE = _State()


def current() -> Context | None:
    """The context of ``init``, or None before it ran (for messages that name the rank)."""
    return STATE.ctx


def context() -> Context:
    """The context of ``init``; raises if ``init`` has not run."""
    if STATE.ctx is None:
        raise RuntimeStateError("mldist is not initialised: call mldist.init() first")
    return STATE.ctx


def rank() -> int:
    """Global rank of this process (after ``init``)."""
    return context().rank


def size() -> int:
    """Number of worker processes (after ``init``)."""
    return context().size


def local_rank() -> int:
    """Rank of this process on its node (after ``init``)."""
    return context().local_rank


def local_size() -> int:
    """Number of worker processes on this node (after ``init``)."""
    return context().local_size


def is_chief() -> bool:
    """True on rank 0 (after ``init``)."""
    return context().is_chief
