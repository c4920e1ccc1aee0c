"""mldist submit/status/logs/cancel against a real Slurm (two emulated nodes on this host).

The cluster comes from scripts/slurm-cluster.sh. Without root these tests skip
with the reason; with CI=true a cluster that cannot start is a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, clean_env, mldist

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment for CLI calls that reach the test cluster."""
    if os.geteuid() != 0:
        reason = "the test Slurm cluster needs root (it installs and starts slurmctld/slurmd)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "; CI must run them")
        pytest.skip(reason)
    res = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        pytest.fail(f"the test Slurm cluster did not start:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    conf = res.stdout.strip().splitlines()[-1].removeprefix("export SLURM_CONF=")
    state = tmp_path_factory.mktemp("mldist-state")
    yield clean_env(SLURM_CONF=conf, MLDIST_STATE_DIR=str(state))
    subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)


def _submit(env: dict[str, str], *args: str) -> str:
    res = mldist(["submit", *args], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    m = re.search(r"submitted job (\S+) \(slurm\)", res.stdout)
    assert m, res.stdout
    return m.group(1)


def wait_for(env: dict[str, str], job: str, states: set[str], timeout: float = 300) -> str:
    """Poll ``mldist status JOB`` until its state is one of ``states``."""
    deadline, line = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        res = mldist(["status", job], env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        line = res.stdout
        if any(f" {s} " in f" {line} " for s in states):
            return line
        time.sleep(1)
    raise AssertionError(f"job {job} never reached {states}: last status {line!r}")


def test_two_node_training_runs_to_completion(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "job"
    example = ROOT / "examples" / "digits_cnn.py"
    job = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "1", "--time", "10",
        "--venv", str(ROOT / ".venv"), "--output-dir", str(out), "--job-name", "digits",
        "--", "python", str(example), "--epochs", "3", "--out", str(out / "results"),
    )  # fmt: skip
    status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    batch = mldist(["logs", job], env=slurm_env).stdout
    assert " COMPLETED " in f" {status} ", f"{status}\n{batch}"
    assert "job step ended with exit code 0" in batch
    seen = set()
    for rank in (0, 1):
        log = mldist(["logs", job, "--rank", str(rank)], env=slurm_env)
        assert log.returncode == 0, log.stderr
        m = re.search(r"rank (\d) of 2 on (\S+) \(launcher slurm\)", log.stdout)
        assert m, log.stdout[-2000:]
        seen.add(int(m.group(1)))
        result = json.loads((out / "results" / f"result-rank{rank}.json").read_text())
        assert (result["rank"], result["size"]) == (rank, 2)
    assert seen == {0, 1}
    env_record = (out / f"environment-{job}.txt").read_text()
    assert "## pip freeze" in env_record and "tensorflow" in env_record


def test_cancel_a_running_job(slurm_env: dict[str, str], tmp_path: Path) -> None:
    job = _submit(slurm_env, "--output-dir", str(tmp_path / "sleeper"), "--", "sleep", "300")
    wait_for(slurm_env, job, {"RUNNING"}, timeout=120)
    res = mldist(["cancel", job], env=slurm_env)
    assert res.returncode == 0, res.stderr
    wait_for(slurm_env, job, {"CANCELLED"}, timeout=120)
