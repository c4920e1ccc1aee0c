"""A rank alive but stuck: the job ends in seconds and names the late rank and where it is (slow).

tests/workers/late.py: rank 0 trains with Keras fit; the other ranks stop before their 4th step:
asleep, in a pure-Python loop, or in a C call that holds Python's lock. One launch of 4 ranks
covers the three at once (launches are what costs here). Launchers: ``mldist run`` (MPI, JAX),
Open MPI's ``mpirun`` (tests/slurm/test_slurm_mpi.py has ``srun -N 2``, test_hosts ``-H``).
Also: ``mldist stacks`` and SIGQUIT on a running ``mldist run`` that then ends normally.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, USERS_GC, WORKERS, check, clean_env, mldist, wait_for_progress

pytestmark = pytest.mark.slow

MPIRUN = str(Path(PY).parent / "mpirun")
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
LATE = WORKERS / "late.py"
#: Where the stuck ranks are: the lines of late.py a stall line must name.
SOURCE = LATE.read_text().splitlines()
SLEEP_LINE = next(i for i, line in enumerate(SOURCE, 1) if "# sleeping here" in line)
BUSY_LINES = {i for i, line in enumerate(SOURCE, 1) if "while True:" in line or "total += 1" in line}
TIMEOUT = "15"


def launch(launcher: str, backend: str, *how: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run late.py on ``len(how) + 1`` ranks; the result and the seconds from the first STUCK line to the end."""
    env = clean_env(**USERS_GC, MLDIST_COLLECTIVE_TIMEOUT=TIMEOUT, KERAS_BACKEND=backend, **AS_ROOT)
    n = str(len(how) + 1)
    if launcher == "mpirun":
        argv = [MPIRUN, "-n", n, "--oversubscribe", PY, str(LATE), *how]
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    else:
        res = mldist(["run", "-n", n, "--no-run-dir", "--", PY, str(LATE), *how], env=env, timeout=120)
    ended = time.time()
    stuck = [float(line.split()[-1]) for line in res.stdout.splitlines() if "STUCK" in line]
    assert stuck, res.stdout[-2000:] + res.stderr[-3000:]
    return res, ended - min(stuck)


def late_line(res: subprocess.CompletedProcess[str], rank: int) -> str:
    found = [line for line in res.stderr.splitlines() if f"rank {rank} has not reached collective #" in line]
    assert found, res.stderr[-4000:]
    return found[0]


CASES = [("mldist run", "tensorflow"), ("mpirun", "tensorflow"), ("mldist run", "jax")]


@pytest.mark.parametrize("launcher, backend", CASES, ids=["mldist-run-mpi", "mpirun-mpi", "mldist-run-jax"])
def test_a_sleeping_a_busy_and_a_gil_holding_rank_are_named_with_where_they_are(launcher: str, backend: str) -> None:
    res, took = launch(launcher, backend, "sleep", "busy", "gil")
    assert res.returncode != 0 and "UNREACHABLE" not in res.stdout
    assert took < 45, f"the job ended {took:.0f} s after the ranks got stuck\n{res.stderr[-3000:]}"
    sleeping, busy, gil = late_line(res, 1), late_line(res, 2), late_line(res, 3)
    assert f"late.py:{SLEEP_LINE} stuck: time.sleep(600)" in sleeping, sleeping
    assert any(f"late.py:{n} spin" in busy for n in BUSY_LINES), busy
    assert re.search(r"it finished #\d+ ", sleeping) and "MLDIST_COLLECTIVE_TIMEOUT=15" in res.stderr
    # Its watch thread cannot run: what is known is its last record, and the line says how old.
    assert "holds Python's lock" in gil and re.search(r"this is \d+ s old", gil), gil


def test_ranks_in_different_collectives_are_both_named() -> None:
    """On JAX the step's all-reduce and a broadcast wait for each other; the MPI engine refuses the
    mismatch at once instead (CollectiveMismatch, test_engine's)."""
    res, took = launch("mldist run", "jax", "desync")
    assert res.returncode != 0 and took < 45, res.stderr[-3000:]
    # Both ranks wait, each for the other: whichever watch fires first speaks, naming both sides.
    step = "a training step compiled by XLA"
    pattern = rf"rank [01] is in #(\d+) ({step}|broadcast) while rank [01] is in #\1 ({step}|broadcast)"
    found = re.search(pattern, res.stderr)
    assert found and {found.group(2), found.group(3)} == {step, "broadcast"}, res.stderr[-3000:]


def test_stacks_and_sigquit_show_every_rank_of_a_running_job_which_then_finishes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [PY, "-m", "mldist", "run", "-n", "2", "--run-dir", str(run_dir), "--", PY, str(WORKERS / "steady.py"), "14"]
    launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        wait_for_progress(run_dir / "progress", 2, 90)  # both ranks in their loop
        shown = check(mldist(["stacks", str(run_dir)]))
        launcher.send_signal(signal.SIGQUIT)
        out, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err[-3000:]
    assert out.count("DONE") == 2
    for rank in (0, 1):
        block = shown.stdout.split(f"rank {rank} (")[1]
        assert re.search(r"#\d+ allreduce\(sum\)", block.splitlines()[0]), shown.stdout
        assert "steady.py:" in block and "step" in block, shown.stdout
        assert re.search(rf"mldist run: rank {rank} \(.*#\d+ allreduce\(sum\)", err), err[-3000:]
    assert "mldist run:     " in err and "steady.py:" in err


def test_a_custom_jax_loop_marks_its_step_with_stall_watch() -> None:
    env = clean_env(**USERS_GC, MLDIST_COLLECTIVE_TIMEOUT=TIMEOUT, KERAS_BACKEND="jax")
    res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, str(WORKERS / "jax_loop.py")], env=env, timeout=120)
    assert res.returncode != 0 and "UNREACHABLE" not in res.stdout, res.stderr[-3000:]
    line = late_line(res, 1)
    assert re.search(r"collective #\d+ my step after \d+ s: it finished #\d+ my step", line), line
    assert "jax_loop.py:" in line and "time.sleep(600)" in line, line
