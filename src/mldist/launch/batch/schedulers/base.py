"""The record that describes one scheduler, and the job state every parser returns.

A scheduler is data: how its directives look, how a job starts its tasks,
which commands submit, cancel and query a job, and how to read their output.
Adding a scheduler is one module with one :class:`Scheduler` and one test file.

Example:
    >>> format_directives("#PBS", " ", [("-N", "x"), ("-j", "oe"), ("-q", None)])
    ['#PBS -N x', '#PBS -j oe']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ....errors import ConfigError

if TYPE_CHECKING:
    from ..spec import JobSpec

#: Terminal states, in mldist's common vocabulary (Slurm's words).
FINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
)

#: A directive row: the flag and its value; None leaves the row out, "" writes the flag alone.
Row = tuple[str, "str | None"]


@dataclass(frozen=True)
class JobStatus:
    """A job's state as mldist reports it.

    Args:
        job_id: the scheduler's id.
        state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... (Slurm's words).
        exit_code: the batch script's exit code, once known.
        restarts: how often the job was requeued (Slurm).
    """

    job_id: str
    state: str
    exit_code: int | None = None
    restarts: int = 0

    @property
    def final(self) -> bool:
        """True once the job will not run again."""
        return self.state in FINAL


@dataclass(frozen=True)
class Scheduler:
    """Everything mldist needs to know about one batch scheduler.

    Args:
        name: the ``--scheduler`` value.
        prefix, separator: directive lines are ``prefix flag<separator>value``.
        directives: the job's directive rows (raises ConfigError for what the scheduler cannot do).
        launcher: the default ``--launcher`` (see ``launchers.LAUNCHERS``).
        nodefile: the variable naming the job's node file (for mpirun/Hydra), if any.
        job_id_var: the variable holding the job id inside the job.
        workdir: a script line that enters the submit directory, or "".
        resubmit: the script line that requeues the job after exit code 75.
        own_timer: the scheduler sends no early signal: the script arms its own timer.
        batch_log: the batch script's log, relative to the output directory (``{id}``: job id).
        status: argv of the status command for a job id.
        parse_status: reads the status command's output (job id, text).
        submit, cancel: argv builders (script path or job id in); default ``qsub``/``qdel``.
        parse_job_id: reads the submit command's output; default its last word.
        probes: ``(argv, regex)`` pairs whose match on the output identifies the scheduler.
        path_forbidden: characters the output directory cannot hold in a directive.
        array_index: shell expression of an array task's index ("" if the scheduler has no arrays).
        array_log: an array task's batch log, relative to the output directory (``{id}``, ``{index}``).
        elastic: a job can keep its allocation when a node fails (Slurm's ``--no-kill``).
        start_estimate: argv asking when a queued job is expected to start (its output: the time), if the
            scheduler tells.
    """

    name: str
    prefix: str
    separator: str
    directives: Callable[[JobSpec], list[Row]]
    launcher: str
    job_id_var: str
    workdir: str
    resubmit: str
    own_timer: bool
    batch_log: str
    status: Callable[[str], list[str]]
    parse_status: Callable[[str, str], JobStatus]
    submit: Callable[[str], list[str]] = lambda script: ["qsub", script]  # PBS and Cobalt alike
    cancel: Callable[[str], list[str]] = lambda job_id: ["qdel", job_id]
    parse_job_id: Callable[[str], str] = lambda out: last_line(out).split()[-1]
    probes: tuple[tuple[tuple[str, ...], str], ...] = ()
    nodefile: str | None = None
    path_forbidden: str = "\"\\%\n\r\0 \t#'"
    array_index: str = ""
    array_log: str = ""
    elastic: bool = False
    start_estimate: Callable[[str], list[str]] | None = None

    def directive_lines(self, spec: JobSpec) -> list[str]:
        """The header's directive lines: the table's rows, then the user's raw ones."""
        lines = format_directives(self.prefix, self.separator, self.directives(spec))
        return lines + [f"{self.prefix} {d}" for d in spec.directives]


def format_directives(prefix: str, separator: str, rows: Sequence[Row]) -> list[str]:
    """Directive lines from rows; rows whose value is None are left out."""
    return [f"{prefix} {flag}{separator + value if value else ''}" for flag, value in rows if value is not None]


def check_dependency(value: str | None, grammar: re.Pattern[str], scheduler: str, form: str) -> str | None:
    """``value`` if it matches the scheduler's dependency ``grammar`` whole, else a ConfigError showing ``form``.

    Args:
        value: the ``--dependency`` given, or None.
        grammar: what the scheduler takes (matched with fullmatch).
        scheduler: its name, for the message.
        form: the accepted form with an example.

    Example:
        >>> check_dependency("4242", re.compile("[0-9]+"), "cobalt", "JOBID[:JOBID...]") == "4242"
        True
    """
    if value is not None and not grammar.fullmatch(value):
        raise ConfigError(f"--dependency {value!r} is not a {scheduler} dependency: give {form}")
    return value


def hms(seconds: int) -> str:
    """``H:MM:SS`` for a number of seconds (wall times in directives).

    Args:
        seconds: a duration, at least 0.

    Example:
        >>> hms(5400)
        '1:30:00'
    """
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def last_line(output: str) -> str:
    """The last non-blank line of a command's output, stripped ('' if none)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""
