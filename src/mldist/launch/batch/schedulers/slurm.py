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
from .base import FINAL, JobStatus, Row, Scheduler, check_dependency, hms, last_line

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


_JOB = r"[0-9]+(?:_[0-9]+)?"  # a job, or one task of an array (4242_3)
_AFTER = rf"after:{_JOB}(?:\+[0-9]+)?(?::{_JOB}(?:\+[0-9]+)?)*"  # after:JOB+MINUTES
_KINDS = "afterany|afterburstbuffer|aftercorr|afternotok|afterok"
_ITEM = rf"(?:{_AFTER}|(?:{_KINDS}):{_JOB}(?::{_JOB})*|singleton|expand:{_JOB})"
#: ``sbatch --dependency``: TYPE:JOB[:JOB...] items joined by ',' (all must hold); Slurm still takes
#: the old form too, bare ids joined by ':' (afterany).
DEPENDENCY = re.compile(rf"{_ITEM}(?:,{_ITEM})*|{_JOB}(?::{_JOB})*")
DEPENDENCY_FORM = (
    "TYPE:JOBID[:JOBID...] joined by ',' (TYPE: after, afterany, afterok, afternotok, aftercorr, "
    "afterburstbuffer; or singleton), e.g. afterok:4242"
)


def _output(out: str) -> str:
    # sbatch splits directive words at blanks, strips quotes and cuts at '#'; double quotes
    # protect all of these (the spec refuses '"' and '\\' in the path).
    return f'"{out}"' if any(c in out for c in " \t'#") else out


def directives(s: JobSpec) -> list[Row]:
    """The ``#SBATCH`` rows of a job."""
    rows: list[Row] = [
        ("--job-name", s.job_name),
        ("--nodes", f"{s.min_nodes}-{s.nodes}" if s.nodes_range else str(s.nodes)),
        ("--ntasks-per-node", str(s.tasks)),
        # An array task's %j is its own id; %A_%a names it by the array's id (the one recorded) and index.
        ("--output", _output(s.output_dir + ("/job-%A_%a.out" if s.array else "/job-%j.out"))),
        ("--open-mode", "append"),  # a requeued job appends to its log
        ("--cpus-per-task", str(s.threads) if s.threads else None),
        # No thread count known: whole nodes, so that the cores measured at the start are the job's.
        ("--exclusive", "" if not s.threads else None),
        *_gpus(s),
        ("--time", slurm_time(s.time_seconds) if s.time_seconds else None),
        ("--mem", s.mem),
        ("--mem-per-cpu", s.mem_per_cpu),
        ("--dependency", check_dependency(s.dependency, DEPENDENCY, "Slurm", DEPENDENCY_FORM)),
        ("--array", s.array),
        ("--account", s.account),
        ("--partition", s.queue),
        ("--constraint", s.constraint),
    ]
    if s.requeue:
        rows += [("--requeue", ""), ("--signal", f"B:USR1@{s.grace}")]
    if s.min_nodes is not None:  # keep the allocation when a node fails: the agent re-forms on the rest
        rows += [("--no-kill", "")]
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
    """Read ``scontrol show job -o``: one line, or one per task of an array (summed up).

    Example:
        >>> parse_status("7", "JobId=7 JobState=RUNNING Restarts=1 ExitCode=0:0").restarts
        1
        >>> parse_status("7", "JobId=8 JobState=COMPLETED\\nJobId=7 JobState=RUNNING").state
        'RUNNING'
    """
    rows = [_status_row(job_id, dict(re.findall(r"(\w+)=(\S*)", line))) for line in text.splitlines()]
    tasks = [row for row in rows if row is not None]
    if not tasks:
        raise ConfigError(f"Slurm knows no job {job_id} (finished jobs are forgotten after MinJobAge)")
    if len(tasks) == 1:
        return tasks[0]
    states = [t.state for t in tasks]
    # An array: running while any task runs, else pending while any waits, else the first failure's state.
    live = [s for s in ("RUNNING", *states) if s in states and s not in FINAL]
    done = [s for s in states if s != "COMPLETED"] or ["COMPLETED"]
    codes = [t.exit_code for t in tasks if t.exit_code is not None]
    state = live[0] if live else done[0]
    return JobStatus(job_id, state, max(codes) if codes and not live else None, max(t.restarts for t in tasks))


def exit_code(text: str) -> int | None:
    """The exit code in Slurm's ``ExitCode=CODE:SIGNAL``; a script killed by signal N is 128+N, as a shell says.

    Example:
        >>> exit_code("3:0"), exit_code("0:9"), exit_code("")
        (3, 137, None)
    """
    m = re.fullmatch(r"([0-9]+)(?::([0-9]+))?", text)
    if not m:
        return None
    code, signal = int(m.group(1)), int(m.group(2) or 0)
    return 128 + signal if signal and not code else code


def _status_row(job_id: str, fields: dict[str, str]) -> JobStatus | None:
    if "JobState" not in fields:
        return None
    code = exit_code(fields.get("ExitCode", ""))
    return JobStatus(job_id, fields["JobState"], code, int(fields.get("Restarts", "0") or 0))


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
    array_index="${SLURM_ARRAY_TASK_ID:-0}",
    array_log="job-{id}_{index}.out",
    elastic=True,
    start_estimate=lambda job_id: ["squeue", "--start", "-h", "-j", job_id, "-o", "%S"],
)
