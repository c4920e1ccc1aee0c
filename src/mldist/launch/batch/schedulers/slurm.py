"""Slurm: ``sbatch`` directives, ``srun`` tasks, ``scontrol`` for state, ``scontrol requeue``.

Example:
    >>> from mldist.launch.batch.spec import JobSpec
    >>> SLURM.directive_lines(JobSpec(command=("true",), nodes=2, output_dir="/o"))[:2]
    ['#SBATCH --job-name=mldist', '#SBATCH --nodes=2']
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ....errors import ConfigError
from .base import JobStatus, Row, Scheduler, hms, last_line

if TYPE_CHECKING:
    from ..spec import JobSpec


def slurm_time(seconds: int) -> str:
    """Slurm's ``D-HH:MM:SS`` (days only when needed).

    Example:
        >>> slurm_time(90000)
        '1-1:00:00'
    """
    days, rest = divmod(seconds, 86400)
    return f"{days}-{hms(rest)}" if days else hms(rest)


def _output(out: str) -> str:
    # sbatch splits directive words at blanks, strips quotes and cuts at '#'; double quotes
    # protect all of these (the spec refuses '"' and '\\' in the path).
    return f'"{out}"' if any(c in out for c in " \t'#") else out


def directives(s: JobSpec) -> list[Row]:
    """The ``#SBATCH`` rows of a job."""
    rows: list[Row] = [
        ("--job-name", s.job_name),
        ("--nodes", str(s.nodes)),
        ("--ntasks-per-node", str(s.tasks)),
        ("--output", _output(s.output_dir + "/job-%j.out")),
        ("--open-mode", "append"),  # a requeued job appends to its log
        ("--cpus-per-task", str(s.threads) if s.threads else None),
        # No thread count known: whole nodes, so that the cores measured at the start are the job's.
        ("--exclusive", "" if not s.threads else None),
        *_gpus(s),
        ("--time", slurm_time(s.time_seconds) if s.time_seconds else None),
        ("--mem", s.mem),
        ("--mem-per-cpu", s.mem_per_cpu),
        ("--dependency", s.dependency),
        ("--array", s.array),
        ("--account", s.account),
        ("--partition", s.queue),
        ("--constraint", s.constraint),
    ]
    if s.requeue:
        rows += [("--requeue", ""), ("--signal", f"B:USR1@{s.grace}")]
    return rows


def _gpus(s: JobSpec) -> list[Row]:
    """The GPU request the way the site asks for it (``gpu_request``)."""
    if not s.gpus_per_node:
        return []
    flag, count = {
        "node": ("--gpus-per-node", s.gpus_per_node),
        "task": ("--gpus-per-task", 1),
        "total": ("--gpus", s.nodes * s.gpus_per_node),
    }[s.gpu_request]
    return [(flag, str(count))]


def parse_status(job_id: str, text: str) -> JobStatus:
    """Read ``scontrol show job -o``.

    Example:
        >>> parse_status("7", "JobId=7 JobState=RUNNING Restarts=1 ExitCode=0:0").restarts
        1
    """
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobState" not in fields:
        raise ConfigError(f"Slurm knows no job {job_id} (finished jobs are forgotten after MinJobAge)")
    code = fields.get("ExitCode", "")
    exit_code = int(code.split(":")[0]) if code[:1].isdigit() else None
    return JobStatus(job_id, fields["JobState"], exit_code, int(fields.get("Restarts", "0") or 0))


SLURM = Scheduler(
    name="slurm",
    prefix="#SBATCH",
    separator="=",
    directives=directives,
    launcher="srun",
    job_id_var="SLURM_JOB_ID",
    workdir="",
    resubmit='scontrol requeue "$SLURM_JOB_ID"',
    own_timer=False,
    batch_log="job-{id}.out",
    submit=lambda script: ["sbatch", "--parsable", script],
    cancel=lambda job_id: ["scancel", job_id],
    status=lambda job_id: ["scontrol", "show", "job", "-o", job_id],
    parse_job_id=lambda out: last_line(out).split(";", 1)[0],
    parse_status=parse_status,
    path_forbidden='"\\%\n\r\0',
)
