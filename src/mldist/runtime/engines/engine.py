"""The collective engines behind one small interface, and joining the MPI world.

Which engine a run uses is decided once, in :func:`mldist.placement.engines.decide`;
here are the engines themselves (:class:`Engine`: ``start``, ``allreduce``,
``broadcast``, ``allgather``, ``abort``, ``join``, ``subgroup``), looked up by name, and
:func:`probe_mpi`, which gives ``decide`` the MPI world this worker joined.

Each engine states what it can do (:class:`Engine`'s flags); the rest of mldist asks
those, never the engine's name. One process has the :data:`SOLO` engine: no collectives.

Example::

    eng = get("mpi")                      # mldist.runtime.engines.mpi_host.engine("mpi")
    strategy, workers = eng.start(tf, placement)
    total, = eng.allreduce([tf.constant([1.0, 2.0])], "sum")
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ...base import processwide
from ...errors import DetectionError, UnsupportedError
from ...placement import Placement, common, detect, no_discovery
from ...placement.engines import COMMUNICATIONS, MpiWorld, mpi_problem
from ..context import STATE, context

__all__ = [
    "COMMUNICATIONS",
    "MPI_MARKERS",
    "NO_SUBGROUPS",
    "SOLO",
    "Engine",
    "MpiWorld",
    "Solo",
    "WholeWorld",
    "get",
    "mpi_allgather_hosts",
    "mpi_problem",
    "probe_mpi",
    "running",
]

#: Variables that MPI-capable launchers set in every rank (srun forms a world only with a PMI
#: plugin the MPI speaks; ``mldist run`` goes through mpiexec for the MPI engine).
MPI_MARKERS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PALS_RANKID", "ALPS_APP_PE", "SLURM_STEP_ID")

#: Reads the stalled-collective watch's graph counters (see :mod:`mldist.runtime.watch.stall`).
Probe = Callable[[], tuple[int, int, int]]


class Engine(Protocol):
    """What every collective engine provides; buffers are 1-D tensors fused by :mod:`collectives`."""

    name: str
    #: True when ``allreduce`` may write its result into its input buffers (callers then
    #: pass buffers nothing else reads: see :func:`mldist.runtime.collect.collectives.owned`).
    in_place: bool
    #: Collectives can run over a subset of the ranks (Horovod's process sets): see :meth:`subgroup`.
    subgroups: bool
    #: A rank can join (Horovod's ``hvd.join``): it answers the others' all-reduces until all have joined.
    joins: bool
    #: Its collectives may be compiled by XLA (``jit_compile=True``); mldist's CPU engines may not.
    xla_safe: bool
    #: Its collectives are not tf.distribute's: tf.distribute code gets a MultiWorkerMirroredStrategy
    #: started on demand (``mldist.strategy()``).
    late_strategy: bool
    #: Its own exit handler waits for every rank (MPI_Finalize, jax.distributed's shutdown barrier):
    #: a rank that leaves alone must not reach it (:func:`mldist.runtime.watch.leave.at_exit`).
    waits_at_exit: bool
    #: Rank 0 can gather a small row from every rank beside the collectives, on a channel of their own
    #: (:meth:`aside`): the slow-rank account's rounds (:mod:`mldist.runtime.watch.straggler_gather`).
    gathers_aside: bool

    def aside(self, rank: int, size: int) -> Any:
        """The channel for the slow-rank rounds (a :class:`mldist.runtime.watch.straggler_gather.Aside`; only where
        ``gathers_aside``)."""
        ...

    @property
    def host(self) -> Any:
        """Its collectives on numpy arrays, without TensorFlow (``allreduce(arrays, op)``, ``broadcast(arrays, root,
        rank)``, ``allgather(array, size)``: same shapes and dtypes back), or None where the engine is
        TensorFlow's own (RING, NCCL): a numpy script then starts TensorFlow (:mod:`mldist.runtime.start.tf_start`)."""
        ...

    def start(self, tf: Any, placement: Placement) -> tuple[Any, tuple[str, ...]]:
        """Join the other workers; the tf.distribute strategy (or None) and the workers' addresses."""
        ...

    def allreduce(self, buffers: list[Any], op: str, layout: int = 0) -> list[Any]:
        """Element-wise "sum", "max", "min" or "prod" of each buffer over the ranks (in place if ``in_place``).

        ``layout`` identifies the shapes the buffers were flattened from (0: unknown); an engine that
        checks its ranks agree compares it too (two shapes of one size must not reduce together).
        """
        ...

    def broadcast(self, buffers: list[Any], root: int, rank: int) -> list[Any]:
        """``root``'s buffers on every rank."""
        ...

    def allgather(self, value: Any, size: int) -> Any:
        """Every rank's ``value`` concatenated on axis 0 (the first dimension may differ)."""
        ...

    def abort(self, code: int) -> None:
        """End every rank now, where the engine can (after an error on this rank); else return."""
        ...

    def join(self) -> int:
        """Horovod's join (only where ``joins``): answer the others' all-reduces until all joined; the last rank."""
        ...

    def subgroup(self, key: int, ranks: tuple[int, ...]) -> Any:
        """A :class:`mldist.runtime.engines.subsets.Subset` of ``ranks`` (only where ``subgroups``; collective)."""
        ...

    def watch_probe(self, tf: Any) -> tuple[Probe | None, Sequence[str]]:
        """Graph counters for the stalled-collective watch, or None when the engine marks in Python."""
        ...


class Solo:
    """The engine of one process: nothing to reach, every collective is the identity.

    ``mldist.init`` starts no engine for one worker; this stands in for it wherever the
    runtime asks what the engine can do, so one process asks like many.

    Example:
        >>> SOLO.allreduce([1.0], "sum"), SOLO.subgroup(1, (0,)).ranks
        ([1.0], (0,))
    """

    name = "none"
    in_place = False
    subgroups = True  # a process set of one process is that process
    joins = False  # hvd.join of one process returns at once: a plain collective
    xla_safe = False  # as on the CPU engines: a script that works alone works on 2 workers
    late_strategy = False
    waits_at_exit = False
    gathers_aside = False  # nothing to gather from

    def aside(self, rank: int, size: int) -> Any:
        """Not used (``gathers_aside`` is False)."""
        raise UnsupportedError("one process has no other ranks to gather from")

    @property
    def host(self) -> Solo:
        """Itself: its collectives take numpy arrays as they take anything."""
        return self

    def start(self, tf: Any, placement: Placement) -> tuple[Any, tuple[str, ...]]:
        """Nothing to join."""
        return None, ()

    def allreduce(self, buffers: list[Any], op: str, layout: int = 0) -> list[Any]:
        """The buffers themselves: one rank's sum, max, min and product."""
        return buffers

    def broadcast(self, buffers: list[Any], root: int, rank: int) -> list[Any]:
        """The buffers themselves: this rank is the root."""
        return buffers

    def allgather(self, value: Any, size: int) -> Any:
        """``value`` itself: the concatenation of one."""
        return value

    def abort(self, code: int) -> None:
        """Nothing else to end."""

    def join(self) -> int:
        """Not used (``joins`` is False)."""
        raise UnsupportedError("join needs an engine that joins (the MPI engine)")

    def subgroup(self, key: int, ranks: tuple[int, ...]) -> Any:
        """A subset with no communicator: its collectives never leave this process."""
        from .subsets import Subset

        return Subset(key, ranks, None)

    def watch_probe(self, tf: Any) -> tuple[Probe | None, Sequence[str]]:
        """Nothing to watch."""
        return None, ()


#: The engine of one process (``ctx.communication == "none"``).
SOLO = Solo()

#: Why a subset of the ranks (a Horovod process set) cannot be had on this engine.
NO_SUBGROUPS = "process sets need the MPI engine (this run uses {name}); start with --communication mpi"


def running() -> Engine:
    """The engine ``mldist.init`` started (:data:`SOLO` for one process); raises before ``init``.

    Example::

        if not running().xla_safe: ...
    """
    context()  # RuntimeStateError before init
    engine: Engine = STATE.engine or SOLO
    return engine


class WholeWorld:
    """For engines whose collectives always span every rank: no joins, no sub-groups."""

    name: str
    subgroups = False
    joins = False
    gathers_aside = False  # unless the engine says otherwise (JAX's coordination service)

    def aside(self, rank: int, size: int) -> Any:
        """Refused: see ``gathers_aside``."""
        raise UnsupportedError(f"the {self.name} engine cannot gather beside its collectives")

    def join(self) -> int:
        """Refused: see ``joins``."""
        raise UnsupportedError(f"join needs the MPI engine (this run uses {self.name}); start with --communication mpi")

    def subgroup(self, key: int, ranks: tuple[int, ...]) -> Any:
        """Refused: see ``subgroups``."""
        raise UnsupportedError(NO_SUBGROUPS.format(name=self.name))


_MODULES = {"mpi": "mpi_host", "ring": "tf_engine", "nccl": "tf_engine", "jax": "jax_engine"}
_ENGINES: dict[str, Engine] = {SOLO.name: SOLO}


def get(name: str) -> Engine:
    """The engine called ``name`` ("none", "mpi", "ring", "nccl" or "jax").

    Cached: collectives look it up while TensorFlow traces them, where an import would
    make autograph try (and fail) to convert the import machinery.
    """
    if name not in _ENGINES:
        module = importlib.import_module(f"{__package__}.{_MODULES[name]}")
        _ENGINES[name] = module.engine(name)
    return _ENGINES[name]


def probe_mpi(env: Mapping[str, str]) -> MpiWorld | str | None:
    """Join the MPI world when an MPI launcher started this process: mpi4py's view, or why it failed.

    Importing ``mpi4py.MPI`` initialises MPI, so nothing is imported when no
    launcher variable says there is a world to join (None).
    """
    if not any(name in env for name in MPI_MARKERS):
        return None
    if "mpi4py.MPI" not in sys.modules:  # MPI reads its settings once, as it starts (a bare mpirun: no hook)
        processwide.update_env("os.environ: MPI's tuning", common.added(os.environ, common.MPI_TUNING))
    try:
        from mpi4py import MPI
    except ImportError:
        return "mpi4py is not installed (pip install 'mldist[cpu]', or build mpi4py against the site's MPI)"
    except RuntimeError as exc:  # the MPI library failed to load or initialise
        return f"MPI failed to initialise ({str(exc).splitlines()[0]})"
    world = MPI.COMM_WORLD
    return MpiWorld(world.Get_rank(), world.Get_size(), MPI.Get_library_version().splitlines()[0].strip())


def mpi_allgather_hosts(my_host: str) -> Sequence[str]:
    """Every rank's host name, gathered over MPI: for launchers that give ranks but no host list.

    Raises DetectionError naming both views and the fix when mpi4py's world is not the
    launcher's (a PyPI MPI under aprun or srun sees a world of one process per rank).
    """
    try:
        from mpi4py import MPI
    except ImportError:
        return no_discovery(my_host)  # raises, naming the fix
    world = MPI.COMM_WORLD
    placement = detect(os.environ)
    mpi = MpiWorld(world.Get_rank(), world.Get_size(), MPI.Get_library_version().splitlines()[0].strip())
    if problem := mpi_problem(placement.rank, placement.size, placement.launcher, mpi):
        raise DetectionError(
            f"cannot find the other workers' hosts over MPI: {problem}; "
            "or set MLDIST_WORKERS=host:port,... (every rank's address) in every rank"
        )
    return list(world.allgather(my_host))
