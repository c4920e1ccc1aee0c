"""The MPI engine across the test cluster's two nodes: srun --mpi=pmix (the cluster's default).

Ranks started by plain ``srun`` join one MPI world that spans node1 and node2, talk over TCP
(Open MPI's path between nodes), compute what one process computes on the union batch, and
end the job step fast when one of them leaves; where the world does not match the launcher
(``--mpi=pmi2``: a world of one per rank) ``auto`` says why and uses RING.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import PY, USERS_GC, WORKERS, check, clean_env, results, tail

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def srun(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``srun -N 2 --ntasks-per-node=1 ARGS`` on the test cluster (one rank per node)."""
    argv = ["srun", "-N", "2", "--ntasks-per-node=1", "--time=5", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def _connected(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether ranks ``a`` and ``b`` hold the two ends of one TCP connection."""
    ends = {tuple(c.split(">")) for c in a["tcp"]}
    return any((remote, local) in ends for local, remote in (c.split(">") for c in b["tcp"]))


def test_one_mpi_world_spans_both_nodes_over_tcp(slurm_env: dict[str, str]) -> None:
    res = check(srun(slurm_env, PY, str(WORKERS / "mpi_probe.py")))
    rows = results(res.stdout)
    assert [(r["rank"], r["size"], r["engine"]) for r in rows] == [(0, 2, "mpi"), (1, 2, "mpi")], tail(res)
    nodes = [r["node"] for r in rows]  # whichever two of the cluster's nodes Slurm picked: one rank on each
    assert len(set(nodes)) == 2 and all(re.fullmatch(r"node[0-9]+", n) for n in nodes), rows
    assert [r["sum"] for r in rows] == [3.0, 3.0], rows  # 1 + 2 on both ranks
    assert _connected(rows[0], rows[1]), f"no TCP connection between the ranks: {rows}"


def test_a_world_of_one_per_rank_falls_back_to_ring_and_says_why(slurm_env: dict[str, str]) -> None:
    res = check(srun(slurm_env, "--mpi=pmi2", PY, str(WORKERS / "mpi_probe.py")))
    rows = results(res.stdout)
    assert [(r["rank"], r["engine"], r["sum"]) for r in rows] == [(0, "ring", 3.0), (1, "ring", 3.0)], tail(res)
    assert "using TensorFlow's RING collectives, not MPI: mpi4py's MPI (Open MPI" in res.stderr, tail(res)
    assert "sees rank 0 of 1 but the 'slurm' launcher says rank 0 of 2" in res.stderr, tail(res)


def _two_nodes_match_one_process(env: dict[str, str], alone_env: dict[str, str], tmp_path: Path) -> None:
    """tests/workers/fit_modes.py's equivalence under ``srun`` on two nodes: both ranks' weights equal one
    process's (no launcher, ``alone_env``) on the union batch. The one process trains while the job does: the
    test waits for the longer of the two, not for both one after the other."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    fit = [PY, str(WORKERS / "fit_modes.py"), "equivalence"]
    alone = subprocess.Popen([*fit, str(one)], env=alone_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)  # fmt: skip
    try:
        res = check(srun(env, *fit, str(two), timeout=240))
        said = alone.communicate(timeout=240)[0]
    finally:
        alone.kill()  # nothing once it has ended
    assert alone.returncode == 0, said[-3000:]
    w0, w1 = (np.load(two / f"weights-{r}.npy") for r in (0, 1))
    ref = np.load(one / "weights-0.npy")
    assert np.array_equal(w0, w1), tail(res)
    assert np.linalg.norm(w0 - ref) / np.linalg.norm(ref) < 1e-5


def test_two_ranks_on_two_nodes_match_one_process_on_the_union_batch(slurm_env: dict[str, str], tmp_path: Path) -> None:
    _two_nodes_match_one_process(slurm_env, clean_env(), tmp_path)


def test_keras_on_jax_across_two_nodes_matches_one_process(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """The same equivalence with KERAS_BACKEND=jax: jax.distributed started from Slurm's placement."""
    jax = {**slurm_env, "KERAS_BACKEND": "jax"}
    _two_nodes_match_one_process(jax, jax, tmp_path)


#: way -> what names the rank that left (and how) in srun's or the ranks' output. An exception leaves
#: as sys.exit does (mldist's hooks, a nonzero code): it is runtime/test_leave.py's.
LEAVES = {
    "sysexit": r"\(rank 1\): exited with code 3 \(sys\.exit\)",
    "kill": r"node[0-9]+: task 1: Killed",  # the second of the two nodes Slurm picked (4 in the cluster)
    "exit0": r"rank 1 has finished \(exit code 0\)",
}


@pytest.mark.parametrize("way", list(LEAVES))
def test_a_rank_that_leaves_ends_the_step_fast(slurm_env: dict[str, str], way: str) -> None:
    started = time.monotonic()
    env = {**slurm_env, **USERS_GC}
    res = srun(env, "--kill-on-bad-exit=1", PY, str(WORKERS / "leave.py"), way, "keep", timeout=120)
    took = time.monotonic() - started
    assert res.returncode != 0, tail(res)
    assert took < 20, f"took {took:.1f} s\n{tail(res)}"
    assert re.search(LEAVES[way], res.stdout + res.stderr), tail(res)


def test_stuck_ranks_on_both_nodes_are_named(slurm_env: dict[str, str]) -> None:
    """tests/runtime/test_late.py's cases under ``srun -N 2``: rank 0 on node1 names the late ranks."""
    env = {**slurm_env, **USERS_GC, "MLDIST_COLLECTIVE_TIMEOUT": "15"}
    argv = ["srun", "-N", "2", "-n", "4", "--time=5", PY, str(WORKERS / "late.py"), "sleep", "busy", "gil"]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150)
    stuck = [float(line.split()[-1]) for line in res.stdout.splitlines() if "STUCK" in line]
    assert res.returncode != 0 and stuck, tail(res)
    assert time.time() - min(stuck) < 45, tail(res)
    lines = {
        r: [x for x in res.stderr.splitlines() if f"rank {r} has not reached collective #" in x] for r in (1, 2, 3)
    }
    assert lines[1] and "late.py:" in lines[1][0] and "time.sleep(600)" in lines[1][0], tail(res)
    assert lines[2] and "late.py:" in lines[2][0] and " spin" in lines[2][0], tail(res)
    assert lines[3] and "holds Python's lock" in lines[3][0], tail(res)
