"""Submitting jobs and remembering them: the side effects of ``mldist submit``.

Each submitted job keeps ``job.sh`` and ``job.json`` in its output directory,
and an index entry under ``$MLDIST_STATE_DIR`` (default
``~/.local/state/mldist``) so ``status``, ``cancel`` and ``logs`` find it by id.
All of it is owner-only (files 0600, the script 0700, directories 0700, each
less the umask): scripts and records hold ``--env`` values and the command's
arguments (``--token=...``). The scheduler command runs with at least umask 077
too, so the batch log it creates (Slurm: ``SLURM_UMASK``) is private as well.

Example::

    record = submit(spec)
    print(record.job_id, record.output_dir)
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ...base import envvalues, untrusted
from ...base.files import atomic_write, current_umask, make_dirs
from ...errors import ConfigError, LaunchError
from .render import render
from .schedulers import SCHEDULERS, JobStatus, parse_job_id, parse_status, scheduler
from .spec import JobSpec


@dataclass(frozen=True)
class JobRecord:
    """What mldist remembers about a submitted job."""

    job_id: str
    scheduler: str
    output_dir: str
    script: str
    submitted_at: float
    command: tuple[str, ...]
    tasks: int = 0  # ranks in the job (0: recorded before mldist kept it)
    array: str | None = None  # the --array of an array job

    def log_path(self, rank: int | None = None, task: int | None = None) -> Path:
        """The batch log, or rank ``rank``'s log; of array task ``task`` in an array job."""
        sched, folder = scheduler(self.scheduler), Path(self.output_dir)
        if task is not None:
            if rank is not None:
                return folder / f"array-{task}" / f"rank-{rank}.log"
            return folder / sched.array_log.format(id=self.job_id, index=task)
        name = f"rank-{rank}.log" if rank is not None else sched.batch_log.format(id=self.job_id)
        return folder / name


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the job index lives."""
    env = os.environ if env is None else env
    if chosen := envvalues.STATE_DIR.read(env):
        return Path(chosen)
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "state")
    return Path(base) / "mldist"


def _index_path(job_id: str, env: Mapping[str, str] | None) -> Path:
    return state_dir(env) / "jobs" / (re.sub(r"[^A-Za-z0-9_.-]", "_", job_id) + ".json")


def _state_setting(env: Mapping[str, str]) -> str:
    """The variable that placed the job index, as ``NAME='value'`` (for messages)."""
    if chosen := envvalues.STATE_DIR.read(env):
        return f"{envvalues.STATE_DIR.name}={chosen!r}"
    for name in ("XDG_STATE_HOME", "HOME"):
        if env.get(name):
            return f"{name}={env[name]!r}"
    return "HOME unset"


def check_index(env: Mapping[str, str] | None = None, create: bool = True) -> Path:
    """The job index folder, once a record can be written there; else a ConfigError naming it and the fix.

    Asked before a job is submitted: a job the scheduler accepted but mldist could not
    record is one ``status``, ``logs`` and ``cancel`` never find. The test is a real write (a
    probe directory made and removed): root passes every permission check, yet ``/proc``
    refuses even root.

    Args:
        env: where the index lives (default ``os.environ``; see :func:`state_dir`).
        create: make the folder (a submission); False makes nothing lasting (a dry run probes the
            nearest folder that exists).

    Example:
        >>> try:
        ...     check_index({"MLDIST_STATE_DIR": "/etc/passwd"}, create=False)
        ... except ConfigError as exc:
        ...     print(str(exc).split(";")[0])
        job records go to /etc/passwd/jobs, which cannot be written (Not a directory)
    """
    env = os.environ if env is None else env
    folder = state_dir(env) / "jobs"
    try:
        if create:
            probe_in = make_dirs(folder, PRIVATE_DIR)
        else:
            probe_in = next(p for p in (folder, *folder.parents) if os.path.lexists(p))
        if not probe_in.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe_in))
        os.rmdir(tempfile.mkdtemp(prefix=".mldist-probe-", dir=probe_in))
    except OSError as exc:
        raise ConfigError(
            f"job records go to {folder}, which cannot be written ({exc.strerror}); {_state_setting(env)}: "
            "set MLDIST_STATE_DIR to a writable directory"
        ) from None
    return folder


class UnrecordedJob(LaunchError):
    """The scheduler accepted the job, but its record could not be written; ``record`` is what was known."""

    def __init__(self, record: JobRecord, why: str) -> None:
        super().__init__(
            f"job {record.job_id} was submitted ({record.scheduler}), but its record could not be written ({why}); "
            f"mldist status, logs and cancel will not know it: its script and logs are in {record.output_dir}"
        )
        self.record = record


#: Permission bits of what ``submit`` writes (less the umask): only the owner may read them.
PRIVATE_FILE, PRIVATE_SCRIPT, PRIVATE_DIR = 0o600, 0o700, 0o700


def run_command(argv: list[str], timeout: float = 60, umask: int = -1) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command (with ``umask``, if not -1); a missing program is a ConfigError naming it."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, umask=umask
        )
    except FileNotFoundError:
        raise ConfigError(f"{argv[0]!r} is not on PATH: is this a login node of the cluster?") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{' '.join(argv)} did not answer within {timeout:g} s") from None


def probe(argv: list[str]) -> str:
    """What ``argv`` printed on both streams; '' if it cannot run or takes over 20 s (a scheduler probe).

    Example:
        >>> probe(["/no/such/program"])
        ''
    """
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout + res.stderr


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def submit(spec: JobSpec, env: Mapping[str, str] | None = None, fresh: bool = False) -> JobRecord:
    """Write the script into the output directory, submit it and record the job.

    Args:
        spec: the job.
        env: where the job index lives (default ``os.environ``; see :func:`state_dir`).
        fresh: the output directory was made for this job: removed again if nothing was submitted.
    """
    out = Path(spec.output_dir)
    script = out / "job.sh"
    check_index(env)  # before the scheduler has the job: a job nobody can find again is worse than none
    # Executable for the owner: Cobalt's qsub runs only executable scripts.
    atomic_write(script, render(spec), PRIVATE_SCRIPT, PRIVATE_DIR)
    argv = scheduler(spec.scheduler).submit(str(script))
    try:
        res = run_command(argv, umask=current_umask() | 0o077)  # the job (and its batch log) inherit it
    except ConfigError:  # no submit command here: nothing was submitted
        _discard(script, fresh)
        raise
    if res.returncode != 0:
        _discard(script, fresh)
        raise LaunchError(f"{argv[0]} refused the job: {_last_line(res.stderr or res.stdout)}")
    record = JobRecord(
        parse_job_id(spec.scheduler, res.stdout),
        spec.scheduler,
        str(out),
        str(script),
        time.time(),
        spec.command,
        spec.total_tasks,
        spec.array,
    )
    text = json.dumps(dataclasses.asdict(record), indent=2) + "\n"
    try:  # checked above, but a disk can fill or a folder vanish meanwhile: the job id must still be told
        atomic_write(out / "job.json", text, PRIVATE_FILE, PRIVATE_DIR)
        atomic_write(_index_path(record.job_id, env), text, PRIVATE_FILE, PRIVATE_DIR)
    except OSError as exc:
        raise UnrecordedJob(record, f"{exc.strerror}: {exc.filename}") from None
    return record


def _discard(script: Path, fresh: bool) -> None:
    """Remove the script of a job that was not submitted, and its directory if made for it and now empty."""
    if fresh:
        script.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            script.parent.rmdir()


def load_record(job_id: str, env: Mapping[str, str] | None = None) -> JobRecord:
    """The record of a job this user submitted with mldist."""
    path = _index_path(job_id, env)
    try:
        text = untrusted.read_text(path)
    except untrusted.Unusable as exc:  # another user's index, or not text: said, not taken for "no such job"
        raise ConfigError(f"the record {exc}") from None
    if text is None:
        raise ConfigError(f"no job {job_id!r} was submitted with mldist here (see 'mldist status')") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigError(f"the record {path} is damaged; remove it") from None
    return _record_from(data, path)


#: Field types of a job record file (``tasks`` may be missing in older ones).
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "job_id": str,
    "scheduler": str,
    "output_dir": str,
    "script": str,
    "submitted_at": (int, float),
}


def _record_from(data: object, path: Path) -> JobRecord:
    """A JobRecord from parsed JSON, or a ConfigError naming the file if its shape is wrong."""
    damaged = ConfigError(f"the record {path} is damaged (wrong fields or types); remove it")
    if not isinstance(data, dict) or set(data) - {*_FIELDS, "command", "tasks", "array"}:
        raise damaged
    if not isinstance(data.get("array"), (str, type(None))):
        raise damaged
    if any(not isinstance(data.get(k), t) or isinstance(data.get(k), bool) for k, t in _FIELDS.items()):
        raise damaged
    command, tasks = data.get("command"), data.get("tasks", 0)
    if not (isinstance(command, list) and all(isinstance(c, str) for c in command)):
        raise damaged
    if not untrusted.COUNT.ok(tasks) or not untrusted.UNIX_TIME.ok(data["submitted_at"]):
        raise damaged
    if data["scheduler"] not in SCHEDULERS:
        raise damaged
    return JobRecord(**{**data, "command": tuple(command), "tasks": tasks})


def list_records(env: Mapping[str, str] | None = None) -> list[JobRecord]:
    """All recorded jobs, oldest first."""
    folder = state_dir(env) / "jobs"
    if os.path.isdir(folder) and (why := untrusted.readable_dir(folder)):
        raise ConfigError(f"the job index {folder} {why}; {_state_setting(env if env is not None else os.environ)}")
    records = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            records.append(load_record(path.stem, env))
        except ConfigError as exc:  # one bad file must not hide every other job
            print(f"mldist: warning: skipping {path.name}: {exc}", file=sys.stderr)
    return sorted(records, key=lambda r: r.submitted_at)


def job_status(record: JobRecord) -> JobStatus:
    """Ask the scheduler for a job's state."""
    res = run_command(scheduler(record.scheduler).status(record.job_id))
    return parse_status(record.scheduler, record.job_id, res.stdout if res.returncode == 0 else "")


def start_estimate(record: JobRecord) -> str | None:
    """When the scheduler expects a queued job to start (its words, e.g. ``2026-11-27T08:00:00``), or None."""
    ask = scheduler(record.scheduler).start_estimate
    if ask is None:
        return None
    res = run_command(ask(record.job_id))
    words = res.stdout.split() if res.returncode == 0 else []
    return words[0] if words and words[0] not in ("N/A", "Unknown", "(null)") else None


def cancel(record: JobRecord) -> None:
    """Cancel a job."""
    argv = scheduler(record.scheduler).cancel(record.job_id)
    res = run_command(argv)
    if res.returncode != 0:
        raise LaunchError(f"{argv[0]} {record.job_id} failed: {_last_line(res.stderr or res.stdout)}")
