"""Keras 3 on the JAX backend (KERAS_BACKEND=jax) on real workers: mldist run, Open MPI's mpirun."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from helpers import PY, USERS_GC, WORKERS, check, clean_env, mldist, results, run_py

pytestmark = pytest.mark.slow

JAX = clean_env(KERAS_BACKEND="jax")
MPIRUN = str(Path(PY).parent / "mpirun")
#: Open MPI refuses root without these (the test machine runs as root).
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _mpirun(*argv: str, timeout: float = 240, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**JAX, **AS_ROOT, **(extra or {})}
    return subprocess.run([MPIRUN, "-np", "2", PY, *argv], capture_output=True, text=True, env=env, timeout=timeout)


def test_collectives_on_two_jax_workers() -> None:
    res = check(mldist(["run", "-n", "2", "--", PY, str(WORKERS / "jax_collectives.py")], env=JAX))
    rows = results(res.stdout)
    assert len(rows) == 2
    for row in rows:
        assert (row["backend"], row["engine"]) == ("jax", "jax")
        assert row["sum"] == [[2.0, 1.0], [3]]
        assert (row["mean"], row["max"]) == ([1.0], [1, 0])
        assert row["big_int"] == 2**41 + 1
        assert row["bcast"] == {"a": [0, 2, 4], "s": 1}  # rank 1's values reach rank 0
        assert row["gather"] == [[0, 0], [1, 1], [1, 1]]
        assert row["mismatch"] == "allreduce"  # raised on both ranks, none hangs
        assert row["strategy"].startswith("mldist.strategy() is TensorFlow")
        assert row["tape"].startswith("DistributedGradientTape averages Tens")
        assert row["profiler"]  # JAX's profiler records --profile-steps on JAX
        # Gloo's event loop, and nothing else, runs at SCHED_IDLE (mldist.runtime.engines.jax_cpu).
        assert row["idle_threads"] == row["idled"] and len(row["idled"]) == 1, row
        assert row["loops"] == [True]
    # The launcher read KERAS_BACKEND too: no "the launcher chose the mpi engine" line.
    assert "launcher chose" not in res.stderr


def test_one_jax_process_needs_no_runtime() -> None:
    res = check(run_py(str(WORKERS / "jax_collectives.py"), env=JAX))
    (row,) = results(res.stdout)
    assert (row["backend"], row["engine"], row["sum"], row["mismatch"]) == ("jax", "none", [[1.0, 0.0], [1]], "none")
    assert row["profiler"] and row["idle_threads"] == row["idled"] == []  # one process: no Gloo


@pytest.mark.parametrize("launcher", ["mldist run", "mpirun"])
def test_two_jax_workers_match_one_process_on_the_whole_batch(
    tmp_path: Path, launcher: str, one_process_fit: Callable[[str], Path]
) -> None:
    two = tmp_path
    args = [str(WORKERS / "fit_modes.py"), "equivalence"]
    if launcher == "mpirun":
        check(_mpirun(*args, str(two)))
    else:
        check(mldist(["run", "-n", "2", "--", PY, *args, str(two)], env=JAX, timeout=240))
    w0, w1 = (np.load(two / f"weights-{r}.npy") for r in (0, 1))
    ref = np.load(one_process_fit("jax") / "weights-0.npy")
    assert np.array_equal(w0, w1)
    assert np.linalg.norm(w0 - ref) / np.linalg.norm(ref) < 1e-5


EXIT_3 = """
import sys, time, numpy as np, mldist, mldist.keras
ctx = mldist.init()
import keras
if ctx.rank == 1:
    time.sleep(1)
    sys.exit(3)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(mldist.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
model.fit(np.zeros((64000, 4)), np.zeros(64000), batch_size=8, epochs=5, verbose=0)
print("NOT-STOPPED", flush=True)
"""


@pytest.mark.parametrize("launcher", ["mldist run", "mpirun"])
def test_a_jax_worker_that_exits_ends_the_group_fast(tmp_path: Path, launcher: str) -> None:
    script = tmp_path / "exit3.py"
    script.write_text(EXIT_3)
    start = time.monotonic()
    if launcher == "mpirun":
        res = _mpirun(str(script), timeout=120, extra=USERS_GC)
    else:
        res = mldist(["run", "-n", "2", "--", PY, str(script)], env={**JAX, **USERS_GC}, timeout=120)
    took = time.monotonic() - start
    assert res.returncode != 0 and "NOT-STOPPED" not in res.stdout
    assert "mldist: error (rank 1): exited with code 3 (sys.exit)" in res.stdout + res.stderr
    assert took < 60, f"the group took {took:.0f} s to end"


def test_refused_backend_says_so_in_one_line() -> None:
    res = run_py("-c", "import mldist; mldist.init()", env=clean_env(KERAS_BACKEND="torch"))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "mldist: error: KERAS_BACKEND=torch is not supported by mldist yet; use 'jax' or 'tensorflow'"
    ]


@pytest.mark.parametrize("joins", ["mldist", "keras"])
def test_the_coordinator_listens_on_the_chosen_address_only(joins: str) -> None:
    """JAX binds its coordinator to [::]:port by default; mldist passes rank 0's own address, to
    jax.distributed itself or, for Keras's initialize(), in JAX_COORDINATOR_BIND_ADDRESS."""
    args = ["run", "-n", "2", "--network", "host", "--no-run-dir", "--", PY, str(WORKERS / "jax_listen.py"), joins]
    res = check(mldist(args, env=JAX))
    chosen = {line.split()[-1] for line in res.stdout.splitlines() if "CHOSEN" in line}
    # A dual-stack socket shows an IPv4 address as [::ffff:127.0.0.1]:port.
    listening = [
        re.sub(r"^\[::ffff:(.*)\]", r"\1", line.split()[-1]) for line in res.stdout.splitlines() if "LISTEN" in line
    ]
    assert len(chosen) == 1 and listening, res.stdout
    assert listening == [chosen.pop()], res.stdout  # not *:port, [::]:port or 0.0.0.0:port
