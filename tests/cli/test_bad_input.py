"""Malformed command lines, site files and job records: one stderr line, exit 2, within seconds."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT, clean_env

SUBMIT = ["submit", "--scheduler", "slurm", "--dry-run"]
RUN = ["run", "-n", "2"]
CASES: list[tuple[str, list[str], str]] = [
    ("run-log-dir-is-a-file", [*RUN, "--log-dir", "{file}", "--", "true"], "is a file"),
    ("run-hosts-empty", ["run", "-H", "", "--", "true"], "-H '' names no host"),
    ("run-n-hosts-empty", [*RUN, "-H", "", "--", "true"], "-H '' names no host"),
    (
        "build-env-wheelhouse-below-a-file-dry",
        ["build-env", "--venv", "{tmp}/v", "--wheelhouse", "{file}/wh", "--dry-run"],
        "is a file, so no directory can be made below it",
    ),
    (
        "build-env-wheelhouse-below-a-file",
        ["build-env", "--venv", "{tmp}/v", "--wheelhouse", "{file}/wh"],
        "is a file, so no directory can be made below it",
    ),
    ("run-log-dir-unwritable", [*RUN, "--log-dir", "/proc/mldist-logs", "--", "true"], "cannot be created"),
    ("run-grace-nan", [*RUN, "--grace", "nan", "--", "true"], "not a finite number"),
    ("run-failure-grace-inf", [*RUN, "--failure-grace", "inf", "--", "true"], "not a finite number"),
    ("run-grace-a-year", [*RUN, "--grace", "31536000", "--", "true"], "more than a week"),
    ("run-n-underscore", ["run", "-n", "1_0", "--", "true"], "not a whole number"),
    ("run-n-fullwidth", ["run", "-n", "２", "--", "true"], "not a whole number"),
    ("run-n-huge", ["run", "-n", "99999", "--", "true"], "more than 4096"),
    ("run-restarts-huge", [*RUN, "--max-restarts", "5000", "--", "true"], "more than 1000"),
    ("run-profile-steps-backwards", [*RUN, "--profile-steps", "5:2", "--", "true"], "FIRST <= LAST"),
    ("run-log-level-unknown", [*RUN, "--log-level", "LOUD", "--", "true"], "is not one of TRACE"),
    ("run-mpi-args-open-quote", [*RUN, "--mpi-args", "'-x", "--", "true"], "No closing quotation"),
    ("run-start-timeout-nan", [*RUN, "--start-timeout", "nan", "--", "true"], "not a finite number"),
    ("submit-nodes-huge", [*SUBMIT, "--nodes", "99999999999999999999999", "--", "true"], "not a whole number"),
    ("submit-nodes-over-bound", [*SUBMIT, "--nodes", "200000", "--", "true"], "more than 100000"),
    ("submit-nodes-range-down", [*SUBMIT, "--nodes", "4-2", "--", "true"], "MIN <= MAX"),
    ("submit-array-down", [*SUBMIT, "--array", "3-1", "--", "true"], "the range 3-1 goes down"),
    (
        "submit-srun-mpi-on-pbs",
        [*SUBMIT[:2], "pbs", *SUBMIT[3:], "--srun-mpi", "pmix", "--", "true"],
        "--srun-mpi pmix chooses srun's MPI plugin",
    ),
    ("submit-pull-without-container", [*SUBMIT, "--container-pull", "login", "--", "true"], "there is no --container"),
    (
        "submit-pull-local-sif",
        [*SUBMIT, "--container-pull", "login", "--container", "{file}", "--", "true"],
        "is a local image, so nothing is pulled",
    ),
    (
        "submit-container-cache-empty",
        [*SUBMIT, "--container", "docker://a/b:1", "--container-cache", "", "--", "true"],
        "--container-cache '' names nothing",
    ),
    ("submit-array-word", [*SUBMIT, "--array", "x", "--", "true"], "--array 'x': give indices"),
    (
        "submit-array-pbs-throttle",
        [*SUBMIT[:2], "pbs", *SUBMIT[3:], "--array", "0-9%2", "--", "true"],
        "PBS has no throttle",
    ),
    ("submit-min-nodes-zero", [*SUBMIT, "--min-nodes", "0", "--", "true"], "not at least 1"),
    ("submit-min-nodes-over", [*SUBMIT, "--nodes", "2", "--min-nodes", "3", "--", "true"], "--min-nodes 3 must be"),
    ("submit-min-nodes-twice", [*SUBMIT, "--nodes", "2-4", "--min-nodes", "2", "--", "true"], "give one"),
    ("submit-time-31-digits", [*SUBMIT, "--time", "9" * 31, "--", "true"], "is not M, H:MM:SS"),
    ("submit-time-99-minutes", [*SUBMIT, "--time", "25:99:99", "--", "true"], "go up to 59"),
    ("submit-time-two-years", [*SUBMIT, "--time", "730-00:00:00", "--", "true"], "longer than a year"),
    ("submit-time-newline", [*SUBMIT, "--time", "1:00:00\n", "--", "true"], "is not M, H:MM:SS"),
    ("submit-grace-huge", [*SUBMIT, "--grace", "9999999", "--", "true"], "more than 604800"),
    ("submit-site-wrong-type", [*SUBMIT, "--site", "bad-nodes", "--", "true"], "nodes must be a whole number"),
    ("submit-array-index-no-array", [*SUBMIT, "--wrap", "env T={array_index}", "--", "true"], "needs --array"),
    (
        "submit-array-requeue-pbs",
        [*SUBMIT, "--scheduler", "pbs", "--array", "0-3", "--requeue", "--time", "9", "--", "true"],
        "--requeue with --array on PBS",
    ),
    ("submit-backend-unknown", [*SUBMIT, "--backend", "torch", "--", "true"], "invalid choice: 'torch'"),
    ("submit-container-pull-unknown", [*SUBMIT, "--container-pull", "later", "--", "true"], "invalid choice: 'later'"),
    ("submit-module-two-words", [*SUBMIT, "--module", "cuda 12", "--", "true"], "is not a module name"),
    ("status-empty-id", ["status", ""], "is not a job id"),
    ("status-newline-id", ["status", "4242\n"], "is not a job id"),
    ("cancel-empty-id", ["cancel", ""], "is not a job id"),
    ("logs-rank-beyond-running-job", ["logs", "4242", "--rank", "99", "--follow"], "has ranks 0-1"),
    ("logs-rank-beyond-job", ["logs", "4242", "--rank", "99"], "has ranks 0-1"),
    ("stacks-no-such-path", ["stacks", "/nonexistent/run"], "neither a run directory nor a job id"),
    ("stacks-directory-without-records", ["stacks", "."], "no progress records there"),
    ("stacks-job-not-started", ["stacks", "4242"], "no rank has written its progress yet"),
    ("stacks-unknown-job", ["stacks", "777"], "no job '777' was submitted"),
]
# Each directive value with a trailing newline, on every scheduler (it would end the directive block).
NEWLINE_FLAGS = ["--job-name", "--account", "--partition", "--constraint", "--dependency", "--array", "--mem"]
for _scheduler in ("slurm", "pbs", "cobalt"):
    for _flag in NEWLINE_FLAGS:
        _value = {"--dependency": "afterok:1", "--array": "0-3", "--mem": "4G"}.get(_flag, "x")
        _args = ["submit", "--scheduler", _scheduler, "--dry-run", _flag, _value + "\n", "--", "true"]
        CASES.append((f"{_scheduler}{_flag}-newline", _args, ""))
    _env = ["submit", "--scheduler", _scheduler, "--dry-run", "--env", "K\n=v", "true"]
    CASES.append((f"{_scheduler}-env-key-newline", _env, ""))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with a site file of wrongly typed profiles and a record of a 2-rank job."""
    (tmp_path / "mldist-sites.toml").write_text('[sites.bad-nodes]\nscheduler = "slurm"\nnodes = "two"\n')
    (tmp_path / "a-file").write_text("not a directory\n")
    jobs = tmp_path / "state" / "jobs"
    jobs.mkdir(parents=True)
    record = {
        "job_id": "4242",
        "scheduler": "slurm",
        "output_dir": str(tmp_path / "job"),
        "script": str(tmp_path / "job" / "job.sh"),
        "submitted_at": 1.0,
        "command": ["true"],
        "tasks": 2,
    }
    (jobs / "4242.json").write_text(json.dumps(record))
    return tmp_path


def _mldist(args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(MLDIST_STATE_DIR=str(cwd / "state"), PYTHONPATH=str(ROOT / "src"), **extra)
    return subprocess.run([PY, "-m", "mldist", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=10)


@pytest.mark.parametrize(("args", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(args: list[str], fragment: str, workdir: Path) -> None:
    args = [a.replace("{file}", str(workdir / "a-file")).replace("{tmp}", str(workdir)) for a in args]
    res = _mldist(args, workdir)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert fragment in lines[0]
    assert "Traceback" not in res.stderr


def test_more_workers_than_open_files_allow_is_refused_with_the_reason(workdir: Path) -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    env = clean_env(PYTHONPATH=str(ROOT / "src"))
    cmd = [PY, "-m", "mldist", "run", "-n", "300", "--", "true"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=10, preexec_fn=low_limit)
    assert res.returncode == 2, res.stderr
    assert "needs about" in res.stderr and "ulimit" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_record_of_the_wrong_shape_is_skipped_with_a_warning(workdir: Path) -> None:
    jobs = workdir / "state" / "jobs"
    (jobs / "4243.json").write_text(json.dumps({"job_id": 4243, "command": "true"}))  # valid JSON, wrong shape
    (jobs / "4244.json").write_text(json.dumps(["not", "a", "record"]))
    res = _mldist(["status"], workdir, PATH=os.environ["PATH"])
    assert res.returncode == 0, res.stderr
    assert "4242" in res.stdout  # the good record is still listed
    warnings = [line for line in res.stderr.splitlines() if "skipping" in line]
    assert sorted(w.split("skipping ")[1].split(":")[0] for w in warnings) == ["4243.json", "4244.json"]
    assert "Traceback" not in res.stderr


def test_a_profile_list_given_as_a_string_is_refused(tmp_path: Path) -> None:
    """``modules = "cuda"`` once rendered ``module load c``, ``u``, ``d``, ``a``."""
    (tmp_path / "mldist-sites.toml").write_text('[sites.mine]\nscheduler = "slurm"\nmodules = "cuda"\n')
    res = _mldist([*SUBMIT, "--site", "mine", "--", "true"], tmp_path)
    assert res.returncode == 2
    assert "modules must be a list of strings" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_bad_mldist_plot_stops_mldist_run_before_any_worker_starts(workdir: Path) -> None:
    res = _mldist(["run", "-n", "2", "--", PY, "-c", "print('WORKER RAN')"], workdir, MLDIST_PLOT="yes")
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, (res.stdout, res.stderr)
    assert res.stderr.strip().splitlines() == [
        "mldist run: error: MLDIST_PLOT='yes': use 1 (RunLog draws metrics.png) or 0 (no plot)"
    ]
