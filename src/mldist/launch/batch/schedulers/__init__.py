"""The schedulers mldist writes jobs for, one :class:`Scheduler` record each.

Pure: argv lists out, command output in; ``records`` runs the commands.

Example:
    >>> scheduler("slurm").submit("/w/job.sh")
    ['sbatch', '--parsable', '/w/job.sh']
    >>> parse_job_id("slurm", "4242;cluster\\n")
    '4242'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from ....errors import ConfigError
from .base import FINAL, JobStatus, Scheduler
from .cobalt import COBALT
from .pbs import PBS
from .slurm import SLURM

#: Every scheduler by name, in the order ``--scheduler`` lists them.
SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (SLURM, PBS, COBALT)}

__all__ = ["FINAL", "SCHEDULERS", "JobStatus", "Scheduler", "detect_scheduler", "parse_job_id", "scheduler"]


def scheduler(name: str) -> Scheduler:
    """The record of scheduler ``name``, or a ConfigError listing the known ones.

    Example:
        >>> scheduler("pbs").batch_log
        'job.out'
    """
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise ConfigError(f"--scheduler {name!r} is not one of {', '.join(SCHEDULERS)}") from None


def detect_scheduler(which: Callable[[str], str | None], run: Callable[[list[str]], str]) -> str:
    """Which scheduler this machine has.

    ``sbatch`` on PATH means Slurm (Slurm's own ``qsub`` wrapper does not make
    it PBS); otherwise each scheduler's ``--version`` probes tell PBS Pro from Cobalt.

    Args:
        which: like ``shutil.which``.
        run: runs an argv and returns its output ('' if it failed).
    """
    if which("sbatch"):
        return "slurm"
    for record in SCHEDULERS.values():
        for argv, pattern in record.probes:
            if which(argv[0]) and re.search(pattern, run(list(argv))):
                return record.name
    raise ConfigError("cannot tell which scheduler this machine runs: pass --scheduler slurm|pbs|cobalt")


def parse_job_id(name: str, output: str) -> str:
    """The job id in the submit command's output.

    Example:
        >>> parse_job_id("pbs", "1234.polaris-pbs-01\\n")
        '1234.polaris-pbs-01'
    """
    if not output.strip():
        raise ConfigError(f"{name} printed no job id")
    return scheduler(name).parse_job_id(output)


def parse_status(name: str, job_id: str, text: str) -> JobStatus:
    """Read the status command's output of scheduler ``name``; a job that has not ended has no exit code.

    Slurm reports ``ExitCode=0:0`` while a job runs, and PBS an ``Exit_status`` while it exits:
    neither is the job's outcome yet, so it is dropped here, once for every scheduler.

    Example:
        >>> st = parse_status("slurm", "7", "JobId=7 JobState=RUNNING Restarts=1 ExitCode=0:0")
        >>> st.state, st.exit_code
        ('RUNNING', None)
    """
    status = scheduler(name).parse_status(job_id, text)
    return status if status.final else dataclasses.replace(status, exit_code=None)
