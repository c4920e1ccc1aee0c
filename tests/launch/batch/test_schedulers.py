"""Scheduler detection and parsing of job ids and states (no scheduler needed)."""

from __future__ import annotations

import json

import pytest

from mldist.errors import ConfigError
from mldist.launch.batch.schedulers import detect_scheduler, parse_job_id, parse_status


def _which(*present: str):  # type: ignore[no-untyped-def]
    return lambda name: f"/usr/bin/{name}" if name in present else None


@pytest.mark.parametrize(
    "present, outputs, expected",
    [
        (("sbatch", "qsub", "qstat"), {}, "slurm"),  # Slurm's qsub wrapper does not make it PBS
        (("qsub", "qstat"), {"qstat": "pbs_version = 2022.1.3"}, "pbs"),
        (("qsub", "qstat"), {"qstat": "Cobalt qstat version 1.0.35"}, "cobalt"),
    ],
)
def test_detect_scheduler(present: tuple[str, ...], outputs: dict[str, str], expected: str) -> None:
    assert detect_scheduler(_which(*present), lambda argv: outputs.get(argv[0], "")) == expected


def test_ambiguous_scheduler_asks_for_the_flag() -> None:
    with pytest.raises(ConfigError, match="pass --scheduler"):
        detect_scheduler(_which("qsub", "qstat"), lambda argv: "qstat: unknown option")


def test_job_ids_and_states() -> None:
    assert parse_job_id("slurm", "4242\n") == "4242"
    assert parse_job_id("cobalt", "Job routed to queue 'debug'.\n123456\n") == "123456"
    st = parse_status("slurm", "5", "JobId=5 JobName=x JobState=COMPLETED Reason=None Restarts=1 ExitCode=0:0")
    assert (st.state, st.exit_code, st.restarts, st.final) == ("COMPLETED", 0, 1, True)
    pbs = json.dumps({"Jobs": {"7.pbs": {"job_state": "F", "Exit_status": 3}}})
    assert parse_status("pbs", "7.pbs", pbs).state == "FAILED"
    assert parse_status("cobalt", "9", "JobID: 9\n    State   : running\n").state == "RUNNING"
    with pytest.raises(ConfigError, match="knows no job 5"):
        parse_status("slurm", "5", "")


def test_an_array_job_state_sums_up_its_tasks() -> None:
    """``scontrol show job -o ARRAY`` prints a line per task (pending ones condensed into one)."""
    done = "JobId=4242 ArrayJobId=4242 ArrayTaskId=0 JobState=COMPLETED Restarts=0 ExitCode=0:0"
    failed = "JobId=4243 ArrayJobId=4242 ArrayTaskId=1 JobState=FAILED Restarts=1 ExitCode=3:0"
    waiting = "JobId=4244 ArrayJobId=4242 ArrayTaskId=2-5 JobState=PENDING Restarts=0 ExitCode=0:0"
    running = waiting.replace("PENDING", "RUNNING").replace("2-5", "2")
    st = parse_status("slurm", "4242", "\n".join([done, failed]))
    assert (st.state, st.exit_code, st.restarts, st.final) == ("FAILED", 3, 1, True)
    assert parse_status("slurm", "4242", "\n".join([done, done])).state == "COMPLETED"
    pending = parse_status("slurm", "4242", "\n".join([done, failed, waiting]))
    assert (pending.state, pending.exit_code, pending.final) == ("PENDING", None, False)
    mixed = parse_status("slurm", "4242", "\n".join([waiting, done, running]))
    assert (mixed.state, mixed.exit_code, mixed.final) == ("RUNNING", None, False)
    begun = json.dumps({"Jobs": {"77[].pbs": {"job_state": "B"}}})  # PBS: an array some of whose subjobs run
    assert parse_status("pbs", "77[].pbs", begun).state == "RUNNING"
