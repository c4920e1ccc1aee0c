"""Cobalt (ALCF Theta, ThetaGPU): ``#COBALT`` directives, ``qstat -f`` for state.

Theta's ranks start with ALPS ``aprun`` (the default launcher); ThetaGPU's with
Open MPI's ``mpirun`` (``--launcher openmpi``), which is also what allows GPUs.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> COBALT.directive_lines(JobSpec(command=("true",), scheduler="cobalt", nodes=2, output_dir="/o"))
    ['#COBALT -n 2', '#COBALT -O /o/job']
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from ....base import envvalues
from ....errors import ConfigError
from .base import JobStatus, Row, Scheduler, check_dependency

if TYPE_CHECKING:
    from ..spec import JobSpec

_STATES = {"queued": "PENDING", "user_hold": "PENDING", "running": "RUNNING", "exiting": "RUNNING"}
#: ``qsub --dependencies``: job ids joined by ':' (Cobalt has no TYPE: a job waits for the others to end well).
DEPENDENCY = re.compile(r"[0-9]+(?::[0-9]+)*")
DEPENDENCY_FORM = "job ids joined by ':' (Cobalt takes no TYPE such as afterok), e.g. 1234:1235"


def directives(s: JobSpec) -> list[Row]:
    """The ``#COBALT`` rows of a job."""
    for value, name in ((s.array, "--array"), (s.mem, "--mem"), (s.mem_per_cpu, "--mem-per-cpu")):
        if value:
            raise ConfigError(f"{name} is not supported by Cobalt")
    if s.gpus_per_node and (s.launcher or COBALT.launcher) == "aprun":
        raise ConfigError("--gpus-per-node with Cobalt needs --launcher openmpi (ThetaGPU); aprun nodes have no GPUs")
    return [
        ("-n", str(s.nodes)),
        ("-O", f"{s.output_dir}/job"),
        ("-t", str(math.ceil(s.time_seconds / 60)) if s.time_seconds else None),
        ("-q", s.queue),
        ("-A", s.account),
        ("--attrs", s.constraint),
        ("--dependencies", check_dependency(s.dependency, DEPENDENCY, "Cobalt", DEPENDENCY_FORM)),
    ]


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
    launcher="aprun",
    nodefile="COBALT_NODEFILE",
    job_id_var="COBALT_JOBID",
    workdir="",
    resubmit=envvalues.shell('qsub --env @ATTEMPT@="$((@ATTEMPT@ + 1))" "$@JOB_DIR@/job.sh"'),
    own_timer=True,
    batch_log="job.output",
    status=lambda job_id: ["qstat", "-f", job_id],
    parse_status=parse_status,
    probes=((("qstat", "--version"), r"(?i)cobalt"), (("qsub", "--version"), r"(?i)cobalt")),
)
