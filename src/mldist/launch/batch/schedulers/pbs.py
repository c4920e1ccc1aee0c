"""PBS Pro: ``#PBS`` directives, Cray PALS ``mpiexec`` tasks, ``qstat -F json`` for state.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> PBS.directive_lines(JobSpec(command=("true",), scheduler="pbs", output_dir="/o", cpus_per_task=8))[1]
    '#PBS -l select=1:ncpus=8:mpiprocs=1'
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from ....base import envvalues
from ....errors import ConfigError
from .base import JobStatus, Row, Scheduler, check_dependency, hms

if TYPE_CHECKING:
    from ..spec import JobSpec

# B: an array job some of whose subjobs have begun.
_STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "R": "RUNNING", "E": "RUNNING", "B": "RUNNING"}
_STATES |= {"F": "FINISHED"}
_VERSION = r"pbs_version|OpenPBS|PBS ?Pro"
_JOB = r"[0-9]+(?:\[[0-9]*\])?(?:\.[A-Za-z0-9_.-]+)?"  # 1234, 1234.server, 1234[].server
_KINDS = "after|afterok|afternotok|afterany|before|beforeok|beforenotok|beforeany|runone"
_ITEM = rf"(?:(?:{_KINDS}):{_JOB}(?::{_JOB})*|on:[0-9]+)"
#: ``qsub -W depend=``: TYPE:JOB[:JOB...] items joined by ','.
DEPENDENCY = re.compile(rf"{_ITEM}(?:,{_ITEM})*")
DEPENDENCY_FORM = (
    "TYPE:JOBID[:JOBID...] joined by ',' (TYPE: after, afterok, afternotok, afterany, before, beforeok, "
    "beforenotok, beforeany; or on:COUNT), e.g. afterok:1234.server"
)


def directives(s: JobSpec) -> list[Row]:
    """The ``#PBS`` rows of a job."""
    if s.constraint:
        raise ConfigError("--constraint is Slurm's; on PBS use --directive '-l select=...' resources")
    if s.array and not re.fullmatch(r"[0-9]+-[0-9]+(?::[0-9]+)?", s.array):
        hint = "PBS has no throttle (%K)" if "%" in s.array else "PBS's -J takes one range"
        raise ConfigError(f"--array {s.array!r}: {hint}; give X-Y or X-Y:STEP (e.g. 0-9)")
    if s.array and s.requeue:
        raise ConfigError("--requeue with --array on PBS: a subjob cannot resubmit itself alone; drop one of them")
    if s.mem_per_cpu:
        raise ConfigError("--mem-per-cpu is Slurm's; on PBS give --mem (per node)")
    check_dependency(s.dependency, DEPENDENCY, "PBS", DEPENDENCY_FORM)
    # Without a thread count the job takes whole nodes (excl) and measures their cores when it starts.
    ncpus = f":ncpus={s.tasks * s.threads}" if s.threads else ""
    select = f"select={s.nodes}{ncpus}:mpiprocs={s.tasks}"
    if s.gpus_per_node:
        select += f":ngpus={s.gpus_per_node}"
    if s.mem:
        select += f":mem={s.mem.lower().removesuffix('b')}b"
    return [
        ("-N", s.job_name),
        ("-l", select),
        ("-l", "place=scatter" if s.threads else "place=scatter:excl"),
        # PBS Pro puts each subjob's index where ^array_index^ stands.
        ("-o", f"{s.output_dir}/job.^array_index^.out" if s.array else f"{s.output_dir}/job.out"),
        ("-j", "oe"),
        ("-l", f"walltime={hms(s.time_seconds)}" if s.time_seconds else None),
        ("-q", s.queue),
        ("-A", s.account),
        ("-W", f"depend={s.dependency}" if s.dependency else None),
        ("-J", s.array),
    ]


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
    launcher="pals",
    nodefile="PBS_NODEFILE",
    job_id_var="PBS_JOBID",
    workdir='cd "$PBS_O_WORKDIR"',
    resubmit=envvalues.shell('qsub -v @ATTEMPT@="$((@ATTEMPT@ + 1))" "$@JOB_DIR@/job.sh"'),
    own_timer=True,
    batch_log="job.out",
    status=lambda job_id: ["qstat", "-x", "-f", "-F", "json", job_id],
    parse_status=parse_status,
    probes=((("qstat", "--version"), _VERSION), (("qsub", "--version"), _VERSION)),
    array_index="${PBS_ARRAY_INDEX:-${PBS_ARRAYID:-0}}",  # PBS Pro's, else Torque's
    array_log="job.{index}.out",
)
