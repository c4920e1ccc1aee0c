"""Which collective engine a run uses, and the module that implements it.

``auto`` picks NCCL when the worker has a GPU, MPI on CPU-only workers when
mpi4py is importable and its world agrees with the launcher (same size and
rank), and TensorFlow's RING otherwise, with a one-line reason.

Example:
    >>> choose("auto", rank=0, size=2, launcher="openmpi", has_gpu=False, mpi=MpiWorld(0, 2, "Open MPI v5"))
    Choice(name='mpi', reason='')
    >>> choose("auto", rank=0, size=2, launcher="tf_config", has_gpu=False, mpi=None).name
    'ring'
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from ..errors import ConfigError

COMMUNICATIONS = ("auto", "mpi", "ring", "nccl")
#: Variables that MPI-capable launchers set in every rank (srun forms a world only with a PMI
#: plugin the MPI speaks; ``mldist run`` goes through mpiexec for the MPI engine).
MPI_MARKERS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PALS_RANKID", "ALPS_APP_PE", "SLURM_STEP_ID")


#: How to make mpi4py's world match the launcher's, per launcher (else :data:`DEFAULT_MPI_FIX`).
MPI_FIXES = {
    "slurm": "build mpi4py against the site's MPI, or use srun --mpi=pmix",
    "aprun": "build mpi4py against Cray MPICH (module load cray-mpich; "
    "MPICC='cc -shared' pip install --no-binary=mpi4py --no-cache-dir mpi4py)",
}
DEFAULT_MPI_FIX = "build mpi4py against the launcher's MPI"


@dataclass(frozen=True)
class MpiWorld:
    """What mpi4py reports about the MPI world this process joined.

    Args:
        rank, size: ``COMM_WORLD``'s.
        library: ``MPI.Get_library_version()``'s first line.
    """

    rank: int
    size: int
    library: str


@dataclass(frozen=True)
class Choice:
    """The engine to use and, when ``auto`` could not use MPI, why (else "")."""

    name: str
    reason: str = ""


def mpi_problem(rank: int, size: int, launcher: str, mpi: MpiWorld | str | None) -> str:
    """Why the MPI engine cannot serve this placement ("" when it can), with the fix.

    Example:
        >>> mpi_problem(1, 2, "aprun", MpiWorld(0, 1, "Open MPI v5.0.8, package: ..."))[:44]
        "mpi4py's MPI (Open MPI v5.0.8) sees rank 0 o"
    """
    if isinstance(mpi, str):
        return mpi
    if mpi is None:
        return f"the {launcher!r} launcher started no MPI world (start the workers with mpiexec, srun or mldist run)"
    if (mpi.size, mpi.rank) != (size, rank):
        name = mpi.library.split(",")[0]
        return (
            f"mpi4py's MPI ({name}) sees rank {mpi.rank} of {mpi.size} but the {launcher!r} launcher says "
            f"rank {rank} of {size}: {MPI_FIXES.get(launcher, DEFAULT_MPI_FIX)}"
        )
    return ""


def choose(requested: str, rank: int, size: int, launcher: str, has_gpu: bool, mpi: MpiWorld | str | None) -> Choice:
    """The engine for ``requested`` ("auto", "mpi", "ring" or "nccl").

    Args:
        requested: the user's setting.
        rank, size, launcher: this process's placement.
        has_gpu: whether the worker sees a GPU.
        mpi: mpi4py's world, a reason it could not be had, or None when it was not asked
            (the launcher starts no MPI world).
    """
    if requested not in COMMUNICATIONS:
        raise ConfigError(f"communication={requested!r} is not one of {', '.join(COMMUNICATIONS)}")
    if requested == "nccl" and not has_gpu:
        raise ConfigError("communication='nccl' needs a GPU on every worker; use 'mpi' or 'ring' on CPUs")
    problem = mpi_problem(rank, size, launcher, mpi) if requested in ("auto", "mpi") and not has_gpu else ""
    if requested == "mpi" and problem:
        raise ConfigError(f"communication='mpi' cannot work here: {problem}")
    if requested != "auto":
        return Choice(requested)
    if has_gpu:
        return Choice("nccl")
    return Choice("ring", problem) if problem else Choice("mpi")


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


_MODULES: dict[str, ModuleType] = {}


def module(name: str) -> ModuleType:
    """The engine module behind ``ctx.communication``: ``mpi_engine`` or ``tf_engine``.

    Cached: collectives look it up while TensorFlow traces them, where an import
    would make autograph try (and fail) to convert the import machinery.
    """
    if name not in _MODULES:
        _MODULES[name] = importlib.import_module(f"{__package__}.{'mpi_engine' if name == 'mpi' else 'tf_engine'}")
    return _MODULES[name]
