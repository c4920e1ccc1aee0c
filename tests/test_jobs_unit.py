"""Scheduler detection and parsing, site profiles, option merging (no scheduler needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mldist.cli import build_parser
from mldist.cli.jobs import build_spec
from mldist.errors import ConfigError
from mldist.launch.batch.schedulers import detect_scheduler, parse_job_id, parse_status
from mldist.launch.batch.sites import load_sites, site_profile
from mldist.launch.batch.spec import parse_time


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


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("0:45", 45), ("2:00:00", 7200), ("1-12", 129600)])
def test_times(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


def test_site_files_override_and_are_checked(tmp_path: Path) -> None:
    (tmp_path / "mldist-sites.toml").write_text(
        '[sites.polaris]\nscheduler = "pbs"\nqueue = "prod"\n[sites.mine]\nscheduler = "slurm"\n'
    )
    sites = load_sites({"HOME": str(tmp_path / "nohome")}, tmp_path)
    assert sites["polaris"]["queue"] == "prod" and sites["mine"]["scheduler"] == "slurm"
    (tmp_path / "mldist-sites.toml").write_text('[sites.bad]\nqueu = "x"\n')
    with pytest.raises(ConfigError, match="unknown option 'queu'"):
        load_sites({"HOME": str(tmp_path)}, tmp_path)
    with pytest.raises(ConfigError, match=r"known sites: .*polaris"):
        site_profile("nowhere", {"HOME": str(tmp_path / "nohome")}, tmp_path / "empty")


def _args(*argv: str) -> argparse.Namespace:
    return build_parser()[0].parse_args(["submit", *argv])


def test_cli_options_override_the_site_and_env_merges(tmp_path: Path) -> None:
    args = _args("--site", "polaris", "--nodes", "3", "--env", "NCCL_NET=Socket", "--env", "A=1",
                 "--output-dir", str(tmp_path), "--", "python", "t.py")  # fmt: skip
    spec = build_spec(args, ["python", "t.py"])
    env = dict(spec.env)
    assert (spec.scheduler, spec.nodes, spec.tasks, spec.gpus_per_node) == ("pbs", 3, 4, 4)
    assert env["NCCL_NET"] == "Socket" and env["A"] == "1" and env["NCCL_CROSS_NIC"] == "1"
    assert "-l filesystems=home:eagle" in spec.directives


def test_a_missing_venv_is_named(tmp_path: Path) -> None:
    args = _args("--scheduler", "slurm", "--venv", str(tmp_path / "nope"), "--", "x")
    with pytest.raises(ConfigError, match="has no bin/activate"):
        build_spec(args, ["x"])
