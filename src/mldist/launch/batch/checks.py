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
from .launchers import LAUNCHERS
from .schedulers import scheduler
from .spec import JobSpec


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
    found = [c for c in scheduler(s.scheduler).path_forbidden if c in s.output_dir]
    if found:
        raise ConfigError(
            f"--output-dir {s.output_dir!r} has {found[0]!r}, which {s.scheduler} directives cannot carry; "
            "choose a plainer path"
        )
    return s
