"""A group that half forms (rank 0 joins, rank 1 finishes without joining) ends at once with one line (slow).

Without it rank 0 would wait for ever in MPI's start-up (``from mpi4py import MPI``, Python's lock
held) or JAX's (``jax.distributed.initialize``). tests/workers/half_formed.py: rank 1 finishes
``after`` rank 0 marked its join (rank 1's start-up hook ends the job at its exit) or ``before``
(rank 0's ``mldist.init()`` ends it). Launchers: ``mldist run`` on MPI and JAX, Open MPI's bare
``mpirun`` with the start-up hook on ``PYTHONPATH`` (as ``mldist submit``'s scripts put it). A group
that never forms at all keeps its line at the end and exit 0 (tests/runtime/test_own_api.py).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, ROOT, WORKERS, clean_env, mldist
from mldist.base.joined import hook_folder

pytestmark = pytest.mark.slow

MPIRUN = str(Path(PY).parent / "mpirun")
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
WORKER = WORKERS / "half_formed.py"
#: The line of the worker's join, which the line must name.
JOINS = {
    how: next(i for i, line in enumerate(WORKER.read_text().splitlines(), 1) if line.strip().startswith(call))
    for how, call in (("mldist", "mldist.init()"), ("jax", "jax.distributed.initialize()"))
}
TIMEOUT = 20


def line_of(join: str) -> re.Pattern[str]:
    return re.compile(
        r"mldist: error: rank 1 exited without joining the group \(no mldist\.init\(\), hvd\.init\(\) or "
        r"keras\.distribution\.initialize\(\)\); rank 0 waits for it in start-up "
        rf"\(\S*half_formed\.py:{JOINS[join]}\): every rank must join \(.*\)$"
    )


def launch(
    launcher: str, backend: str, order: str, join: str = "mldist"
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the worker on 2 ranks; the result and the seconds from rank 1's finish to the job's end."""
    env = clean_env(**AS_ROOT, MLDIST_COLLECTIVE_TIMEOUT=str(TIMEOUT), KERAS_BACKEND=backend)
    if launcher == "mpirun":
        env["PYTHONPATH"] = f"{hook_folder()}:{env['PYTHONPATH']}"
        argv = [MPIRUN, "-n", "2", "--oversubscribe", PY, str(WORKER), order, join]
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90, cwd=ROOT)
    else:
        argv = ["run", "-n", "2", "--no-run-dir", "--", PY, str(WORKER), order, join]
        res = mldist(argv, env=env, timeout=90, cwd=ROOT)
    ended = time.time()
    alone = [float(line.split()[-1]) for line in res.stdout.splitlines() if "ALONE 1 " in line]
    assert alone, res.stdout[-2000:] + res.stderr[-3000:]
    return res, ended - alone[0]


CASES = [
    ("mldist run", "tensorflow", "after", "[1] ", "mldist"),
    ("mldist run", "tensorflow", "before", "[0] ", "mldist"),
    ("mldist run", "jax", "after", "[1] ", "mldist"),
    ("mpirun", "tensorflow", "after", "", "mldist"),
    ("mldist run", "jax", "after", "[1] ", "jax"),
]
IDS = ["run-mpi-after", "run-mpi-before", "run-jax-after", "mpirun-mpi", "run-jax-own-initialize"]


@pytest.mark.parametrize("launcher, backend, order, speaker, join", CASES, ids=IDS)
def test_a_half_formed_group_ends_in_time_with_one_line(
    launcher: str, backend: str, order: str, speaker: str, join: str
) -> None:
    res, took = launch(launcher, backend, order, join)
    assert res.returncode == 2 and "UNREACHABLE" not in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    assert took < TIMEOUT + 20, f"the job ended {took:.0f} s after rank 1 finished\n{res.stderr[-3000:]}"
    lines = [line for line in res.stderr.splitlines() if "without joining the group" in line]
    # One line, said by the rank that saw the other: rank 1 at its exit, or rank 0 as it began to join.
    assert len(lines) == 1 and lines[0].startswith(speaker) and line_of(join).search(lines[0]), res.stderr[-3000:]
    assert "never formed a group" not in res.stderr and "never joined the group" not in res.stderr


def test_a_rank_that_failed_before_joining_is_named_as_failed_not_as_a_script_without_a_join(tmp_path: Path) -> None:
    """Two ranks as a launcher that stops no one starts them (srun without --kill-on-bad-exit): rank 1's script
    raises before its ``mldist.init()``, then rank 0 joins and stops at once, saying that rank 1 failed; it
    did not leave out the join, which the line for a script without one would tell the user to add."""
    env = clean_env(
        MLDIST_SIZE="2",
        MLDIST_WORKERS="localhost:1,localhost:2",
        MLDIST_RUN_ID="failed-before",
        MLDIST_PROGRESS_DIR=str(tmp_path),
    )
    env["PYTHONPATH"] = f"{hook_folder()}:{env['PYTHONPATH']}"
    broke = subprocess.run(
        [PY, "-c", "raise RuntimeError('rank 1 broke before its join')"],
        capture_output=True,
        text=True,
        env={**env, "MLDIST_RANK": "1"},
        timeout=60,
    )
    assert broke.returncode == 1 and "rank 1 broke before its join" in broke.stderr, broke.stderr[-2000:]
    assert (tmp_path / "group-1").read_text().splitlines()[0] == "failed"
    script = tmp_path / "train.py"
    script.write_text("import mldist\n\nmldist.init()\nprint('UNREACHABLE')\n")
    res = subprocess.run(
        [PY, str(script)], capture_output=True, text=True, env={**env, "MLDIST_RANK": "0"}, timeout=120
    )
    assert res.returncode == 2 and "UNREACHABLE" not in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    (said,) = [line for line in res.stderr.splitlines() if line.startswith("mldist: error")]
    assert said == (
        "mldist: error: rank 1 ended on an error before it joined the group (the rank's own error line says "
        f"which); rank 0 waits for it in start-up ({script}:3): the group cannot form, so it stops"
    )
    assert "Traceback" not in res.stderr
