"""``mldist logs JOB`` shows the whole job as ``mldist run`` shows it; ``--follow`` follows every rank."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, ROOT, clean_env


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A recorded 2-rank Slurm job whose directory holds a batch log and two rank logs."""
    out = tmp_path / "job"
    out.mkdir()
    (out / "job-4242.out").write_text("batch: starting\n")
    (out / "rank-0.log").write_text("epoch 1 loss 0.5\n")
    (out / "rank-1.log").write_text("epoch 1 loss 0.6\nno newline at the end")
    jobs = tmp_path / "state" / "jobs"
    jobs.mkdir(parents=True)
    record = {"job_id": "4242", "scheduler": "slurm", "output_dir": str(out), "script": str(out / "job.sh"),
              "submitted_at": 1.0, "command": ["python", "train.py"], "tasks": 2}  # fmt: skip
    (jobs / "4242.json").write_text(json.dumps(record))
    return tmp_path


def _logs(job: Path, *args: str, path: str | None = None) -> subprocess.Popen[str]:
    env = clean_env(MLDIST_STATE_DIR=str(job / "state"), PYTHONPATH=str(ROOT / "src"))
    if path is not None:
        env["PATH"] = path
    cmd = [PY, "-m", "mldist", "logs", "4242", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_the_whole_job_batch_log_then_each_rank_prefixed(job: Path) -> None:
    out, err = _logs(job).communicate(timeout=20)
    assert out.splitlines() == [
        "batch: starting",
        "[0] epoch 1 loss 0.5",
        "[1] epoch 1 loss 0.6",
        "[1] no newline at the end",
    ], err


def test_one_rank_alone_unprefixed(job: Path) -> None:
    out, _ = _logs(job, "--rank", "0").communicate(timeout=20)
    assert out == "epoch 1 loss 0.5\n"


def test_follow_prints_every_ranks_new_lines_until_the_job_ends(job: Path) -> None:
    # A stand-in scontrol: RUNNING until the test creates "done", then COMPLETED.
    bin_dir = job / "bin"
    bin_dir.mkdir()
    done = job / "done"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        f'#!/bin/sh\nif [ -e "{done}" ]; then s=COMPLETED; else s=RUNNING; fi\n'
        'echo "JobId=4242 JobState=$s Restarts=0 ExitCode=0:0"\n'
    )
    scontrol.chmod(0o700)
    proc = _logs(job, "--follow", path=f"{bin_dir}:{os.environ['PATH']}")
    time.sleep(2)
    with open(job / "job" / "rank-0.log", "a") as fh:
        fh.write("epoch 2 loss 0.4\n")
    (job / "job" / "rank-2.log").write_text("a rank whose log appears later\n")
    time.sleep(1.5)
    done.touch()
    out, err = proc.communicate(timeout=30)
    lines = out.splitlines()
    assert proc.returncode == 0, err
    for expected in ("batch: starting", "[0] epoch 2 loss 0.4", "[2] a rank whose log appears later",
                     "[1] no newline at the end"):  # fmt: skip
        assert expected in lines, out
    assert lines.count("[0] epoch 1 loss 0.5") == 1
