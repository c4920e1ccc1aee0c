"""``mldist status``, ``stacks`` and ``logs`` read every run file as untrusted (issue 64).

A run file may be another user's (a 0700 run directory, 0600 files), cut short by a crash or a full
disk, edited by hand, or hold values no writer of mldist makes. Each reader said such a file in a
traceback (``TypeError: 'int' object is not iterable`` for ``"signals": 15``, ``ValueError: Unknown
format code 'g'`` for a loss of ``"0.31"``, ``OverflowError`` for a pid of 2**40 or a time of 1e300,
``PermissionError``) or in a wrong verdict (``ENDED no exit code recorded`` for a run that ended ok but
whose summary.json this user may not read; "no config.json" for one that is there, cut short). Now:
one line per run naming the file and why, the other runs of a listing as before. The run directories
are written by mldist's own writers, then damaged; the permission cases run the reader as ``nobody``
(the suite runs as root, whom no permission stops).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import PY, ROOT, clean_env
from mldist.base import progress, training
from mldist.base.rundir import write_json
from mldist.cli import main
from mldist.launch.config import RunConfig
from mldist.launch.rundir import Record

#: A moment of a fit, as RunLog on rank 0 writes it.
PROGRESS = {"epoch": 2, "epochs": 4, "step": 5, "steps": 10, "step_seconds": 0.5, "samples_per_second": 256.0,
            "metrics": {"loss": 0.25}, "epoch_seconds": 5.0}  # fmt: skip
SETPRIV = shutil.which("setpriv")
as_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv to read as another user (nobody)"
)


def _ended_run(where: Path) -> Path:
    """A run directory of a 2-rank run that ended ok, as mldist run and RunLog leave it."""
    record = Record(RunConfig(2, ("python", "train.py"), run_dir=str(where)), "direct", {})
    write_json(where / training.FILE, training.record(**PROGRESS, done=True))  # type: ignore[arg-type]
    record.end(0, [SimpleNamespace(poll=lambda: 0)] * 2, restarts=0, signals=[])  # type: ignore[list-item]
    return where


def _edit(path: Path, **fields: object) -> None:
    data = json.loads(path.read_text())
    for dotted, value in fields.items():
        *outer, last = dotted.split("__")
        target = data
        for key in outer:
            target = target[key]
        target[last] = value
    path.write_text(json.dumps(data))


def _status(target: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["status", str(target)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("file", "fields", "says"),
    [
        ("summary.json", {"signals": 15}, '"signals" is 15, not a list of a signal name or number'),
        ("summary.json", {"ended": 1e300}, '"ended" is 1e+300, not an ISO time'),
        ("training.json", {"metrics__loss": "0.31"}, '"metrics.loss" is "0.31", not a number'),
        ("training.json", {"updated_unix": 1e300, "done": False}, '"updated_unix" is 1e+300, not a time'),
        ("config.json", {"launcher__pid": 2**40}, '"launcher.pid" is 1099511627776, not a whole number'),
    ],
    ids=["signals-a-number", "ended-1e300", "loss-a-string", "written-1e300", "pid-2**40"],
)
def test_a_damaged_field_is_one_line_naming_the_file_and_the_field(
    file: str, fields: dict[str, object], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _ended_run(tmp_path / "run")
    if file == "config.json":
        (run / "summary.json").unlink()  # a run that goes on: its launcher's pid is asked
    _edit(run / file, **fields)
    code, out, err = _status(run, capsys)
    (line,) = out.splitlines()
    assert (code, err) == (1, ""), (line, err)
    assert f"{run / file} is damaged: {says}" in line, line
    if file == "summary.json":  # it ended (the file is there); how, it cannot say: no verdict of its own
        assert line.startswith(f"{run}  ENDED  how is unknown: "), line


def test_a_half_written_config_is_damaged_not_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _ended_run(tmp_path / "run")
    (run / "summary.json").unlink()
    (run / "config.json").write_text((run / "config.json").read_text()[:50])
    _, out, _ = _status(run, capsys)
    assert out.strip() == (
        f"{run}  UNKNOWN  {run / 'config.json'} is damaged: not JSON (cut short, or written over?)  "
        "epoch 2/4 step 5/10, 256 samples/s, loss 0.25, 5.0 s/epoch, finished"
    ), out
    assert "no config.json" not in out


def test_a_record_with_a_huge_pid_or_time_is_no_overflow_in_stacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _ended_run(tmp_path / "run")
    now = time.time()
    for rank in (0, 1):
        record = progress.Record(rank, socket.gethostname(), os.getpid(), 3, 2, (3, "allreduce(sum)", now - 5),
                                 (2, "broadcast", now - 6), ("t.py:9 <module>: step()",), now)  # fmt: skip
        progress.write(run / "progress", record)
    _edit(run / "progress" / "rank-1.json", written=1e300)
    capsys.readouterr()
    code = main(["stacks", str(run)])
    out, err = capsys.readouterr()
    assert code == 1 and out.startswith("rank 0 ") and "rank 1" not in out, (out, err)
    assert f"mldist stacks: {run / 'progress' / 'rank-1.json'} is damaged: not a progress record" in err, err
    _edit(run / "progress" / "rank-0.json", pid=2**40)  # every record of no use: said, not "no rank has written"
    assert main(["stacks", str(run)]) == 2
    assert "rank-0.json is damaged" in capsys.readouterr().err


def test_a_damaged_training_json_in_one_job_leaves_the_job_list_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One such file inside a batch job's run/ ended the whole ``mldist status`` list in a ValueError."""
    jobs = tmp_path / "state" / "jobs"
    jobs.mkdir(parents=True)
    for number, loss in ((4242, 0.25), (4243, "0.31")):
        out = tmp_path / f"job-{number}"
        write_json(out / "run" / training.FILE, {**training.record(**PROGRESS), "metrics": {"loss": loss}})  # type: ignore[arg-type]
        record = {"job_id": str(number), "scheduler": "slurm", "output_dir": str(out), "script": str(out / "job.sh"),
                  "submitted_at": float(number), "command": ["true"], "tasks": 2}  # fmt: skip
        (jobs / f"{number}.json").write_text(json.dumps(record))
    monkeypatch.setenv("MLDIST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue here: each job's state is UNKNOWN, its progress shown
    capsys.readouterr()
    assert main(["status"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith("          4242  UNKNOWN") and "loss 0.25" in first, first
    assert second.startswith("          4243  UNKNOWN"), second
    assert f'{tmp_path / "job-4243" / "run" / training.FILE} is damaged: "metrics.loss" is "0.31"' in second


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp_path is root's 0700)."""
    where = Path(tempfile.mkdtemp(prefix="mldist-untrusted-"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _as_nobody(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(PYTHONPATH=str(ROOT / "src"), HOME="/nonexistent", PYTHONDONTWRITEBYTECODE="1", **extra)
    cmd = [str(SETPRIV), "--reuid=nobody", "--regid=nogroup", "--clear-groups", PY, "-m", "mldist", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, cwd="/")


@as_nobody
def test_another_users_run_directory_is_one_line_in_status_and_stacks(shared: Path) -> None:
    run = _ended_run(shared / "run")
    progress.write(run / "progress", progress.Record(0, "n1", 7, 1, 1, None, None, (), time.time()))
    assert stat.S_IMODE(run.stat().st_mode) == 0o700  # as mldist run makes it
    res = _as_nobody("status", str(run))
    assert (res.returncode, res.stderr) == (1, ""), res.stderr
    assert res.stdout == f"{run}  UNREADABLE  {run} cannot be read: permission denied ({run} is root's, mode 0700)\n"
    res = _as_nobody("stacks", str(run))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr == f"mldist stacks: error: {run} cannot be read: permission denied ({run} is root's, mode 0700)\n"


@as_nobody
def test_an_unreadable_summary_is_no_verdict(shared: Path) -> None:
    """Files of mode 0600 of another user: it said ``ENDED  no exit code recorded`` for a run that ended ok."""
    run = _ended_run(shared / "run")
    run.chmod(0o755)  # the folder open to all, its files owner-only
    for file in run.glob("*.json"):
        file.chmod(0o600)
    res = _as_nobody("status", str(run))
    assert (res.returncode, res.stderr) == (1, ""), res.stderr
    (line,) = res.stdout.splitlines()
    why = f"{run / 'summary.json'} cannot be read: permission denied ({run / 'summary.json'} is root's, mode 0600)"
    assert line.startswith(f"{run}  ENDED  how is unknown: {why}"), line
    assert "no exit code recorded" not in line and "training.json cannot be read" in line, line


@as_nobody
def test_an_unreadable_rank_log_is_one_line_and_the_others_show(shared: Path) -> None:
    job = shared / "job"
    job.mkdir(mode=0o755)
    for rank in (0, 1):
        (job / f"rank-{rank}.log").write_text(f"hello from {rank}\n")
    (job / "rank-1.log").chmod(0o600)
    state = shared / "state" / "jobs"
    state.mkdir(parents=True, mode=0o755)
    record = {"job_id": "4242", "scheduler": "slurm", "output_dir": str(job), "script": str(job / "job.sh"),
              "submitted_at": 1.0, "command": ["true"], "tasks": 2}  # fmt: skip
    (state / "4242.json").write_text(json.dumps(record))
    for folder in (shared / "state", state):
        folder.chmod(0o755)
    res = _as_nobody("logs", "4242", MLDIST_STATE_DIR=str(shared / "state"))
    assert res.returncode == 0 and res.stdout == "[0] hello from 0\n", (res.stdout, res.stderr)
    assert res.stderr == (
        f"mldist logs: {job / 'rank-1.log'} cannot be read: permission denied ({job / 'rank-1.log'} is root's, "
        "mode 0600)\n"
    )


@as_nobody
def test_another_users_job_records_are_one_line_not_a_traceback(shared: Path) -> None:
    """The job index and its records are owner-only (0700, 0600): another user gets one line naming them."""
    jobs = shared / "state" / "jobs"
    jobs.mkdir(parents=True)
    (shared / "state").chmod(0o755)
    record = {"job_id": "4242", "scheduler": "slurm", "output_dir": str(shared / "job"), "script": "job.sh",
              "submitted_at": 1.0, "command": ["true"], "tasks": 2}  # fmt: skip
    (jobs / "4242.json").write_text(json.dumps(record))
    (jobs / "4242.json").chmod(0o600)
    jobs.chmod(0o700)
    res = _as_nobody("status", MLDIST_STATE_DIR=str(shared / "state"))
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert res.stderr == (
        f"mldist status: error: the job index {jobs} cannot be read: permission denied ({jobs} is root's, mode 0700); "
        f"MLDIST_STATE_DIR='{shared / 'state'}'\n"
    )
    jobs.chmod(0o755)  # the folder open, the record still owner-only: that job is named, as a damaged one is
    res = _as_nobody("status", "4242", MLDIST_STATE_DIR=str(shared / "state"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr == (
        f"mldist status: error: the record {jobs / '4242.json'} cannot be read: permission denied "
        f"({jobs / '4242.json'} is root's, mode 0600)\n"
    )
