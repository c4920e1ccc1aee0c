"""Talking to schedulers: detection, and argv builders and parsers for their commands.

Pure functions: argv lists out, command output in. ``records`` runs them.

Example:
    >>> submit_argv("slurm", "/w/job.sh")
    ['sbatch', '--parsable', '/w/job.sh']
    >>> parse_job_id("slurm", "4242;cluster\\n")
    '4242'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError

#: ``--version`` probes that tell PBS Pro from Cobalt (Slurm is told by ``sbatch``).
VERSION_PROBES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("qstat", "--version"), r"pbs_version|OpenPBS|PBS ?Pro", "pbs"),
    (("qsub", "--version"), r"pbs_version|OpenPBS|PBS ?Pro", "pbs"),
    (("qstat", "--version"), r"(?i)cobalt", "cobalt"),
    (("qsub", "--version"), r"(?i)cobalt", "cobalt"),
)

#: Terminal states, in mldist's common vocabulary.
FINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
}
_PBS_STATES = {
    "Q": "PENDING",
    "H": "PENDING",
    "W": "PENDING",
    "R": "RUNNING",
    "E": "RUNNING",
    "F": "FINISHED",
}


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


def detect_scheduler(which: Callable[[str], str | None], run: Callable[[list[str]], str]) -> str:
    """Which scheduler this machine has.

    ``sbatch`` on PATH means Slurm (Slurm's own ``qsub`` wrapper does not make
    it PBS); otherwise ``qstat``/``qsub --version`` tell PBS Pro from Cobalt.

    Args:
        which: like ``shutil.which``.
        run: runs an argv and returns its output ('' if it failed).
    """
    if which("sbatch"):
        return "slurm"
    for argv, pattern, name in VERSION_PROBES:
        if which(argv[0]) and re.search(pattern, run(list(argv))):
            return name
    raise ConfigError("cannot tell which scheduler this machine runs: pass --scheduler slurm|pbs|cobalt")


def submit_argv(scheduler: str, script: str) -> list[str]:
    """The submit command for a rendered script."""
    return ["sbatch", "--parsable", script] if scheduler == "slurm" else ["qsub", script]


def parse_job_id(scheduler: str, output: str) -> str:
    """The job id from the submit command's output.

    Example:
        >>> parse_job_id("pbs", "1234.polaris-pbs-01\\n")
        '1234.polaris-pbs-01'
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"{scheduler} printed no job id")
    last = lines[-1]
    return last.split(";", 1)[0] if scheduler == "slurm" else last.split()[-1]


def cancel_argv(scheduler: str, job_id: str) -> list[str]:
    """The cancel command."""
    return ["scancel", job_id] if scheduler == "slurm" else ["qdel", job_id]


def status_argv(scheduler: str, job_id: str) -> list[str]:
    """The command whose output ``parse_status`` reads."""
    return {
        "slurm": ["scontrol", "show", "job", "-o", job_id],
        "pbs": ["qstat", "-x", "-f", "-F", "json", job_id],
        "cobalt": ["qstat", "-f", job_id],
    }[scheduler]


def _slurm_status(job_id: str, text: str) -> JobStatus:
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobState" not in fields:
        raise ConfigError(f"Slurm knows no job {job_id} (finished jobs are forgotten after MinJobAge)")
    code = fields.get("ExitCode", "")
    exit_code = int(code.split(":")[0]) if code[:1].isdigit() else None
    return JobStatus(job_id, fields["JobState"], exit_code, int(fields.get("Restarts", "0") or 0))


def _pbs_status(job_id: str, text: str) -> JobStatus:
    try:
        jobs = json.loads(text)["Jobs"]
        info = next(iter(jobs.values()))
    except (ValueError, KeyError, StopIteration, TypeError):
        raise ConfigError(f"PBS knows no job {job_id}") from None
    state = _PBS_STATES.get(info.get("job_state", ""), "UNKNOWN")
    code = info.get("Exit_status")
    if state == "FINISHED":
        state = "COMPLETED" if code == 0 else ("CANCELLED" if code in (-3, 271) else "FAILED")
    return JobStatus(job_id, state, code if isinstance(code, int) else None)


def _cobalt_status(job_id: str, text: str) -> JobStatus:
    m = re.search(r"^\s*State\s*:\s*(\S+)", text, re.MULTILINE)
    if not m:
        raise ConfigError(f"Cobalt knows no job {job_id}")
    raw = m.group(1).lower()
    state = {"queued": "PENDING", "user_hold": "PENDING", "running": "RUNNING", "exiting": "RUNNING"}.get(raw)
    return JobStatus(job_id, state or raw.upper())


def parse_status(scheduler: str, job_id: str, text: str) -> JobStatus:
    """Read the status command's output.

    Example:
        >>> parse_status("slurm", "7", "JobId=7 JobState=RUNNING Restarts=1 ExitCode=0:0").state
        'RUNNING'
    """
    return {"slurm": _slurm_status, "pbs": _pbs_status, "cobalt": _cobalt_status}[scheduler](job_id, text)
