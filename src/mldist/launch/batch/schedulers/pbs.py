"""PBS Pro: ``#PBS`` directives, Cray PALS ``mpiexec`` tasks, ``qstat -F json`` for state.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> PBS.directive_lines(JobSpec(command=("true",), scheduler="pbs", output_dir="/o"))[1]
    '#PBS -l select=1:ncpus=1:mpiprocs=1'
"""

from __future__ import annotations

import json

from ....errors import ConfigError
from ..spec import JobSpec, hms
from .base import JobStatus, Row, Scheduler

_STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "R": "RUNNING", "E": "RUNNING", "F": "FINISHED"}
_VERSION = r"pbs_version|OpenPBS|PBS ?Pro"


def directives(s: JobSpec) -> list[Row]:
    """The ``#PBS`` rows of a job."""
    if s.constraint:
        raise ConfigError("--constraint is Slurm's; on PBS use --directive '-l select=...' resources")
    select = f"select={s.nodes}:ncpus={s.tasks * (s.cpus_per_task or 1)}:mpiprocs={s.tasks}"
    if s.gpus_per_node:
        select += f":ngpus={s.gpus_per_node}"
    if s.mem:
        select += f":mem={s.mem.lower().removesuffix('b')}b"
    return [
        ("-N", s.job_name),
        ("-l", select),
        ("-l", "place=scatter"),
        ("-o", f"{s.output_dir}/job.out"),
        ("-j", "oe"),
        ("-l", f"walltime={hms(s.time_seconds)}" if s.time_seconds else None),
        ("-q", s.queue),
        ("-A", s.account),
        ("-W", f"depend={s.dependency}" if s.dependency else None),
        ("-J", s.array),
    ]


def launch(s: JobSpec) -> list[str]:
    """Cray PALS ``mpiexec``: ranks per node, CPUs per rank, bound by depth."""
    depth = str(s.cpus_per_task or 1)
    return ["mpiexec", "-n", str(s.total_tasks), "--ppn", str(s.tasks), "--depth", depth, "--cpu-bind", "depth"]


def parse_status(job_id: str, text: str) -> JobStatus:
    """Read ``qstat -x -f -F json``.

    Example:
        >>> parse_status("7", '{"Jobs": {"7": {"job_state": "F", "Exit_status": 0}}}').state
        'COMPLETED'
    """
    try:
        info = next(iter(json.loads(text)["Jobs"].values()))
    except (ValueError, KeyError, StopIteration, TypeError, AttributeError):
        raise ConfigError(f"PBS knows no job {job_id}") from None
    state = _STATES.get(info.get("job_state", ""), "UNKNOWN")
    code = info.get("Exit_status")
    if state == "FINISHED":
        state = "COMPLETED" if code == 0 else ("CANCELLED" if code in (-3, 271) else "FAILED")
    return JobStatus(job_id, state, code if isinstance(code, int) else None)


PBS = Scheduler(
    name="pbs",
    prefix="#PBS",
    separator=" ",
    directives=directives,
    launch=launch,
    job_id_var="PBS_JOBID",
    workdir='cd "$PBS_O_WORKDIR"',
    resubmit='qsub -v MLDIST_ATTEMPT="$((MLDIST_ATTEMPT + 1))" "$MLDIST_JOB_DIR/job.sh"',
    own_timer=True,
    batch_log="job.out",
    status=lambda job_id: ["qstat", "-x", "-f", "-F", "json", job_id],
    parse_status=parse_status,
    probes=((("qstat", "--version"), _VERSION), (("qsub", "--version"), _VERSION)),
)
