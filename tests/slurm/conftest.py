"""The test Slurm cluster (two emulated nodes on this host) and helpers for the tests that use it.

The cluster comes from scripts/slurm-cluster.sh. Without root these tests skip
with the reason; with CI=true a cluster that cannot start is a failure. The
helpers are fixtures (``_submit``, ``wait_for``) that return functions: a test
folder's conftest.py cannot be imported by name (every folder has one).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from helpers import ROOT, clean_env, mldist

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


def submit_job(env: dict[str, str], *args: str) -> str:
    """``mldist submit ARGS`` on the test cluster; the job id."""
    res = mldist(["submit", *args], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    m = re.search(r"submitted job (\S+) \(slurm\)", res.stdout)
    assert m, res.stdout
    return m.group(1)


def wait_for_state(env: dict[str, str], job: str, states: set[str], timeout: float = 300) -> str:
    """Poll ``mldist status JOB`` until its state is one of ``states``; the status line."""
    deadline, line = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        res = mldist(["status", job], env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        line = res.stdout
        if any(f" {s} " in f" {line} " for s in states):
            return line
        time.sleep(1)
    raise AssertionError(f"job {job} never reached {states}: last status {line!r}")


@pytest.fixture(name="_submit")
def submit_fixture() -> Callable[..., str]:
    """:func:`submit_job`: ``_submit(slurm_env, *submit_args)`` gives the job id."""
    return submit_job


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., str]:
    """:func:`wait_for_state`: ``wait_for(slurm_env, job, {"COMPLETED", ...}, timeout=300)``."""
    return wait_for_state
