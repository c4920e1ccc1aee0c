"""init()'s thread and placement knobs and detection edge cases, in real processes (slow: TF imports)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import WORKERS, check, clean_env, mldist, results, run_py

pytestmark = pytest.mark.slow
THREADS = str(WORKERS / "threads.py")


def test_arguments_beat_variables_beat_the_plan_in_a_real_worker() -> None:
    env = clean_env(MLDIST_INTRA_OP="3", MLDIST_INTER_OP="5")
    knobs = json.dumps({"inter_op": 2, "allow_soft_placement": True})
    (row,) = results(check(run_py(THREADS, knobs, env=env)).stdout)
    assert (row["intra"], row["inter"], row["soft"]) == (3, 2, True)
    assert row["overrides"] == "intra-op from MLDIST_INTRA_OP=3, inter-op from init(inter_op=2)"


def test_two_workers_share_the_cores_without_a_cpus_per_task_variable(
    engine: str, shared_engine: Callable[[str, str], tuple[str, Path]]
) -> None:
    rows = results(shared_engine(engine, "threads")[0])
    share = max(1, len(os.sched_getaffinity(0)) // 2)  # this process's CPUs, which may be fewer than the node's
    assert [(r["intra"], r["cpus"], r["overrides"]) for r in rows] == [(share, share, "")] * 2


def test_an_invalid_thread_count_is_one_line_naming_it() -> None:
    res = check(run_py(THREADS, "{}", env=clean_env(MLDIST_INTRA_OP="-4")), 2)  # a bad value: exit 2, as the CLI's
    assert "MLDIST_INTRA_OP='-4' is not a thread count" in res.stderr
    assert "Traceback" not in res.stderr


# What aprun exports with a PyPI Open MPI in the venv: mpi4py's world is this one process.
APRUN = {"ALPS_APP_PE": "1", "ALPS_APP_ID": "77", "ALPS_APP_DEPTH": "1", "PMI_SIZE": "2"}
MISMATCH = "mpi4py's MPI (Open MPI"


def test_env_under_aprun_with_a_world_of_one_names_the_mismatch_and_the_fix() -> None:
    res = mldist(["env", "--no-tensorflow"], env=clean_env(**APRUN))
    errors = [line for line in res.stdout.splitlines() if line.startswith("error")]
    assert len(errors) == 1, res.stdout + res.stderr
    assert MISMATCH in errors[0] and "sees rank 0 of 1 but the 'aprun' launcher says rank 1 of 2" in errors[0]
    assert "cray-mpich" in errors[0] and "MLDIST_WORKERS" in errors[0]
    assert "zip()" not in res.stdout + res.stderr and "Traceback" not in res.stderr


def test_init_under_aprun_with_a_world_of_one_is_one_line() -> None:
    res = check(run_py("-c", "import mldist; mldist.init()", env=clean_env(**APRUN)), 1)
    lines = [line for line in res.stderr.splitlines() if line.startswith("mldist: error")]
    assert len(lines) == 1 and MISMATCH in lines[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr


def test_env_under_aprun_without_a_size_names_mldist_size() -> None:
    env = clean_env(ALPS_APP_PE="0", ALPS_APP_ID="77")
    res = mldist(["env", "--no-tensorflow"], env=env)
    assert "error     Cray ALPS aprun detected (ALPS_APP_PE is set) but the world size is unknown" in res.stdout
    assert "set MLDIST_SIZE" in res.stdout
