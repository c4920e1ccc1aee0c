"""Cobalt (ALCF Theta): ``#COBALT`` directives, ALPS ``aprun`` tasks, ``qstat -f`` for state.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> COBALT.launch(JobSpec(command=("true",), scheduler="cobalt", nodes=2))[:5]
    ['aprun', '-n', '2', '-N', '1']
"""

from __future__ import annotations

import math
import re

from ....errors import ConfigError
from ..spec import JobSpec
from .base import JobStatus, Row, Scheduler

_STATES = {"queued": "PENDING", "user_hold": "PENDING", "running": "RUNNING", "exiting": "RUNNING"}


def directives(s: JobSpec) -> list[Row]:
    """The ``#COBALT`` rows of a job."""
    for value, name in ((s.array, "--array"), (s.mem, "--mem"), (s.gpus_per_node, "--gpus-per-node")):
        if value:
            raise ConfigError(f"{name} is not supported by Cobalt")
    return [
        ("-n", str(s.nodes)),
        ("-O", f"{s.output_dir}/job"),
        ("-t", str(math.ceil(s.time_seconds / 60)) if s.time_seconds else None),
        ("-q", s.queue),
        ("-A", s.account),
        ("--attrs", s.constraint),
        ("--dependencies", s.dependency),
    ]


def launch(s: JobSpec) -> list[str]:
    """ALPS ``aprun``; it exports no world size, so the sizes travel as ``-e`` variables."""
    depth = str(s.cpus_per_task or 1)
    argv = ["aprun", "-n", str(s.total_tasks), "-N", str(s.tasks), "-d", depth, "-j", str(s.hyperthreads)]
    argv += ["-cc", "depth"]
    for key, value in (
        ("MLDIST_SIZE", s.total_tasks),
        ("MLDIST_LOCAL_SIZE", s.tasks),
        ("OMP_NUM_THREADS", dict(s.env).get("OMP_NUM_THREADS", depth)),  # the user's --env wins
    ):
        argv += ["-e", f"{key}={value}"]
    return argv


def parse_status(job_id: str, text: str) -> JobStatus:
    """Read ``qstat -f``.

    Example:
        >>> parse_status("9", "JobID: 9\\n    State   : running\\n").state
        'RUNNING'
    """
    m = re.search(r"^\s*State\s*:\s*(\S+)", text, re.MULTILINE)
    if not m:
        raise ConfigError(f"Cobalt knows no job {job_id}")
    raw = m.group(1).lower()
    return JobStatus(job_id, _STATES.get(raw) or raw.upper())


COBALT = Scheduler(
    name="cobalt",
    prefix="#COBALT",
    separator=" ",
    directives=directives,
    launch=launch,
    job_id_var="COBALT_JOBID",
    workdir="",
    resubmit='qsub --env MLDIST_ATTEMPT="$((MLDIST_ATTEMPT + 1))" "$MLDIST_JOB_DIR/job.sh"',
    own_timer=True,
    batch_log="job.output",
    status=lambda job_id: ["qstat", "-f", job_id],
    parse_status=parse_status,
    probes=((("qstat", "--version"), r"(?i)cobalt"), (("qsub", "--version"), r"(?i)cobalt")),
)
