"""Signals and requeue: USR1 before the time limit, exit code 75, resubmission, TERM, other exit codes.

Each test runs a rendered script under the stand-ins (harness.py); two wait for a 3 s timer.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from harness import LAUNCHER, make_job, out_dir, parsed_directives
from helpers import wait_for

pytestmark = pytest.mark.slow

TRAP = {"STANDIN_TRAP_USR1": "1"}  # tasks wait for SIGUSR1, then exit 75


def test_slurm_usr1_saves_and_requeues(tmp_path: Path, standin_bin: Path) -> None:
    """Rank 1 saves a second longer than rank 0: rank 0's exit must not get it killed."""
    job = make_job(
        tmp_path,
        standin_bin,
        job_env=TRAP | {"STANDIN_STAGGER": "1"},
        output_dir=out_dir(tmp_path),
        tasks_per_node=2,
        requeue=True,
        time="10",
        grace=30,
    )
    job.start()
    assert job.proc is not None
    try:
        wait_for(lambda: len(job.calls("argv-recorder")) == 2, 10, "both tasks to start")
        os.kill(job.proc.pid, signal.SIGUSR1)
        assert job.wait(15) == 75, job.explain()
    finally:
        job.stop()
    assert [e["signal"] for e in job.events("srun", "signal")] == [signal.SIGUSR1]
    assert len(job.events("argv-recorder", "usr1")) == 2
    assert len(job.events("argv-recorder", "saved")) == 2  # both ranks finished saving
    assert job.events("srun", "kill-on-bad-exit") == []
    # The wrapper turns 75 into a marker and exit 0; the script turns the markers back into 75.
    assert job.events("srun", "exit")[0]["codes"] == [0, 0]
    assert sorted(p.name for p in Path(out_dir(tmp_path)).glob(".requeue-*")) == [
        ".requeue-4242-0.rank-0",
        ".requeue-4242-0.rank-1",
    ]
    assert job.argvs("scontrol") == [["requeue", "4242"]]
    assert "mldist: USR1" in job.stdout
    assert job.leftovers == []


@pytest.mark.parametrize(
    "scheduler, resubmit",
    [("pbs", ["-v", "MLDIST_ATTEMPT=1"]), ("cobalt", ["--env", "MLDIST_ATTEMPT=1"])],
)
def test_own_timer_signals_before_the_limit(
    scheduler: str, resubmit: list[str], tmp_path: Path, standin_bin: Path
) -> None:
    """time 1 min, grace 57 s: the script's own timer sends USR1 after ~3 s; workers save, job resubmits."""
    job = make_job(
        tmp_path,
        standin_bin,
        scheduler,
        job_env=TRAP,
        output_dir=out_dir(tmp_path),
        tasks_per_node=2,
        requeue=True,
        time="1",
        grace=57,
    )
    began = time.monotonic()
    job.start()
    code = job.wait(15)
    took = time.monotonic() - began
    assert code == 75, job.explain()
    assert 2.5 < took < 12, took
    assert len(job.events("argv-recorder", "usr1")) == 2
    assert [e["signal"] for e in job.events(LAUNCHER[scheduler], "signal")] == [signal.SIGUSR1]
    assert job.argvs("qsub") == [[*resubmit, f"{out_dir(tmp_path)}/job.sh"]]
    assert job.leftovers == []


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_step_exit_75_requeues_with_next_attempt(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    env = {"STANDIN_EXIT": "75", "MLDIST_ATTEMPT": "4"}
    job = make_job(tmp_path, standin_bin, scheduler, job_env=env, output_dir=out_dir(tmp_path), requeue=True, time="10")
    assert job.run() == 75, job.explain()
    assert [t["env"]["MLDIST_ATTEMPT"] for t in job.calls("argv-recorder")] == ["4"]
    expected = {
        "slurm": ("scontrol", [["requeue", "4242"]]),
        "pbs": ("qsub", [["-v", "MLDIST_ATTEMPT=5", f"{out_dir(tmp_path)}/job.sh"]]),
        "cobalt": ("qsub", [["--env", "MLDIST_ATTEMPT=5", f"{out_dir(tmp_path)}/job.sh"]]),
    }[scheduler]
    assert job.argvs(expected[0]) == expected[1]
    assert job.leftovers == []  # PBS/Cobalt: the 9.5-minute timer is gone too


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
@pytest.mark.parametrize("requeue", [True, False])
def test_other_exit_codes_pass_through_without_requeue(
    scheduler: str, requeue: bool, tmp_path: Path, standin_bin: Path
) -> None:
    kw: dict[str, Any] = {"requeue": True, "time": "10"} if requeue else {}
    job = make_job(tmp_path, standin_bin, scheduler, job_env={"STANDIN_EXIT": "3"}, output_dir=out_dir(tmp_path), **kw)
    assert job.run() == 3, job.explain()
    assert job.calls("scontrol") == [] and job.calls("qsub") == []
    assert job.stdout.splitlines()[-1] == "mldist: job step ended with exit code 3"
    assert job.leftovers == []


def test_requeue_disabled_exit_75_does_not_requeue(tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(tmp_path, standin_bin, job_env={"STANDIN_EXIT": "75"}, output_dir=out_dir(tmp_path), time="10")
    assert job.run() == 75, job.explain()
    assert job.calls("scontrol") == []
    assert "--requeue" not in parsed_directives(job.text, "slurm")


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_term_stops_the_step_without_requeue(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(
        tmp_path,
        standin_bin,
        scheduler,
        job_env={"STANDIN_SLEEP": "30"},
        output_dir=out_dir(tmp_path),
        tasks_per_node=2,
        requeue=True,
        time="10",
    )
    job.start()
    assert job.proc is not None
    try:
        wait_for(lambda: len(job.calls("argv-recorder")) == 2, 10, "both tasks to start")
        os.kill(job.proc.pid, signal.SIGTERM)
        assert job.wait(10) == 128 + signal.SIGTERM, job.explain()
    finally:
        job.stop()
    assert [e["signal"] for e in job.events(LAUNCHER[scheduler], "signal")] == [signal.SIGTERM]
    assert job.calls("scontrol") == [] and job.calls("qsub") == []
    assert job.leftovers == []
