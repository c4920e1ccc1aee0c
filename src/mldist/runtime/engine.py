"""The collective engines behind one small interface, and joining the MPI world.

Which engine a run uses is decided once, in :func:`mldist.placement.engines.decide`;
here are the engines themselves (:class:`Engine`: ``start``, ``allreduce``,
``broadcast``, ``allgather``, ``abort``), looked up by name, and
:func:`probe_mpi`, which gives ``decide`` the MPI world this worker joined.

Example::

    eng = get("mpi")                      # mldist.runtime.mpi_engine.ENGINE
    strategy, workers = eng.start(tf, placement)
    total, = eng.allreduce([tf.constant([1.0, 2.0])], "sum")
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..errors import DetectionError
from ..placement import Placement, detect, no_discovery
from ..placement.engines import COMMUNICATIONS, MpiWorld, mpi_problem

__all__ = [
    "COMMUNICATIONS",
    "MPI_MARKERS",
    "Engine",
    "MpiWorld",
    "get",
    "mpi_allgather_hosts",
    "mpi_problem",
    "probe_mpi",
]

#: Variables that MPI-capable launchers set in every rank (srun forms a world only with a PMI
#: plugin the MPI speaks; ``mldist run`` goes through mpiexec for the MPI engine).
MPI_MARKERS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PALS_RANKID", "ALPS_APP_PE", "SLURM_STEP_ID")

#: Reads the stalled-collective watch's graph counters (see :mod:`mldist.runtime.stall`).
Probe = Callable[[], tuple[int, int, int]]


class Engine(Protocol):
    """What every collective engine provides; buffers are 1-D tensors fused by :mod:`collectives`."""

    name: str
    #: True when ``allreduce`` may write its result into its input buffers (callers then
    #: pass buffers nothing else reads: see :func:`mldist.runtime.collectives.owned`).
    in_place: bool

    def start(self, tf: Any, placement: Placement) -> tuple[Any, tuple[str, ...]]:
        """Join the other workers; the tf.distribute strategy (or None) and the workers' addresses."""
        ...

    def allreduce(self, buffers: list[Any], op: str) -> list[Any]:
        """Element-wise "sum", "max", "min" or "prod" of each buffer over the ranks (in place if ``in_place``)."""
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

    def watch_probe(self, tf: Any) -> tuple[Probe | None, Sequence[str]]:
        """Graph counters for the stalled-collective watch, or None when the engine marks in Python."""
        ...


_MODULES = {"mpi": "mpi_engine", "ring": "tf_engine", "nccl": "tf_engine", "jax": "jax_engine"}
_ENGINES: dict[str, Engine] = {}


def get(name: str) -> Engine:
    """The engine called ``name`` ("mpi", "ring", "nccl" or "jax").

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
