"""The checks of a ``JobSpec`` that need the scheduler and launcher tables.

``JobSpec`` checks what it can alone (spec); whether its scheduler and launcher
exist, and whether its output directory fits in that scheduler's directives, needs
the tables that themselves take a ``JobSpec``, so it is checked here, above them.
``build_spec`` and ``render`` run :func:`check`.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> check(JobSpec(command=("python", "train.py"), launcher="hydra")).launcher
    'hydra'
"""

from __future__ import annotations

from ...errors import ConfigError
from .launchers import LAUNCHERS, launcher_name
from .schedulers import scheduler
from .spec import JobSpec
from .staging import check_staging


def check(s: JobSpec) -> JobSpec:
    """``s`` if its launcher and scheduler exist and its directives can carry its output directory.

    Raises ConfigError naming the value and what to give instead.

    Example:
        >>> check(JobSpec(command=("x",), launcher="mpirun"))
        Traceback (most recent call last):
        mldist.errors.ConfigError: --launcher 'mpirun' is not one of srun, aprun, pals, openmpi, hydra
    """
    if s.launcher is not None and s.launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher {s.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    _check_elastic(s)
    check_staging(s)
    if s.srun_mpi not in (None, "auto") and not LAUNCHERS[launcher_name(s)].steps:
        raise ConfigError(
            f"--srun-mpi {s.srun_mpi} chooses srun's MPI plugin, but this job starts its ranks with "
            f"{launcher_name(s)}; drop --srun-mpi"
        )
    found = [c for c in scheduler(s.scheduler).path_forbidden if c in s.output_dir]
    if found:
        raise ConfigError(
            f"--output-dir {s.output_dir!r} has {found[0]!r}, which {s.scheduler} directives cannot carry; "
            "choose a plainer path"
        )
    return s


def _check_elastic(s: JobSpec) -> None:
    """An elastic job (``--min-nodes``) needs a scheduler that keeps the allocation and a launcher of steps."""
    if s.min_nodes is None:
        return
    if not scheduler(s.scheduler).elastic:
        raise ConfigError(
            f"--min-nodes: {s.scheduler} cannot keep a job's nodes when one fails; elastic jobs need Slurm "
            "(--no-kill). Use --requeue to resume from the last checkpoint instead"
        )
    if s.container:
        raise ConfigError(
            "--min-nodes with --container: not yet (the elastic agent runs outside the image); use --venv or --conda"
        )
    if not LAUNCHERS[launcher_name(s)].steps:
        raise ConfigError(f"--min-nodes re-forms the world with srun steps: drop --launcher {launcher_name(s)}")
