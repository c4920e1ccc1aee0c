"""mldist.horovod function by function: 2 and 3 real workers on both engines, refusals, mismatches."""

from __future__ import annotations

import itertools

import pytest

from helpers import PY, WORKERS, check, clean_env, mldist, results, run_py

API = str(WORKERS / "hvd_api.py")
DTYPES = ("float16", "float32", "float64", "int32", "int64")
PER_DTYPE = (
    "allreduce-sum",
    "allreduce-average-false",
    "allreduce-average",
    "allreduce-min",
    "allreduce-max",
    "allreduce-product",
    "allreduce-scaled",
    "grouped-allreduce",
    "allgather",
    "grouped-allgather",
    "broadcast",
    "alltoall",
    "alltoall-splits",
    "reducescatter",
)
ONCE = (
    "broadcast-variables",
    "broadcast-variables-int64",
    "broadcast-inplace",
    "broadcast-object",
    "broadcast-object-fn",
    "allgather-object",
    "join",
    "size-rank-ops",
    "allreduce-gradient",
    "allgather-gradient",
    "sparse-average-values",
    "sparse-average-indices",
    "fp16-compression",
    "tape-predivide",
    "tape-sum",
)
#: Every check the worker must have passed, in order: a skipped check fails the test.
EXPECTED = [
    f"{name}-{dtype}-{mode}" for dtype, mode, name in itertools.product(DTYPES, ("eager", "graph"), PER_DTYPE)
] + list(ONCE)

pytestmark = pytest.mark.slow


# 3 workers on the MPI engine only (2 cores here), RING with 2: both engines and both an even and
# an odd world, without the 2-worker MPI run (each run starts TensorFlow on every worker).
@pytest.mark.parametrize(("workers", "engine"), [(2, "ring"), (3, "mpi")], ids=["2-ring", "3-mpi"])
def test_every_function_matches_numpy(workers: int, engine: str) -> None:
    res = check(mldist(["run", "-n", str(workers), "--communication", engine, "--", PY, API, "collectives"], 300))
    rows = results(res.stdout)
    assert [r["rank"] for r in rows] == list(range(workers))
    for row in rows:
        assert row["size"] == workers
        assert row["checks"] == EXPECTED
        cross_rank, cross_size, homogeneous, mpi = row["info"]
        assert (cross_rank, cross_size, homogeneous, mpi) == (0, 1, True, engine == "mpi")


def test_shapes_that_differ_across_ranks_stop_with_a_clear_error(engine: str) -> None:
    res = check(mldist(["run", "-n", "2", "--communication", engine, "--", PY, API, "mismatch"], 120), 1)
    both = res.stdout + res.stderr
    assert "MISMATCH-RAN" not in both
    assert "workers passed tensors of different shapes" in both
    assert "Traceback" not in both


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_mismatches_raise_horovods_errors_on_every_rank_and_the_ranks_go_on(legacy: str) -> None:
    run = ["run", "-n", "2", "--communication", "mpi", "--", PY, str(WORKERS / "hvd_errors.py")]
    res = check(mldist(run, 120, env=clean_env(TF_USE_LEGACY_KERAS=legacy)))
    rows = results(res.stdout)
    assert [row["caught"] for row in rows] == [["shape", "dtype", "root", "allgather", "grouped", "graph"]] * 2
    assert [row["after"] for row in rows] == [[3.0], [3.0]]


@pytest.mark.parametrize(
    ("engine", "legacy"),
    [("mpi", "0"), ("mpi", "1"), ("ring", "0")],  # the worker uses no Keras: one mode on RING is enough
    ids=["mpi-keras3", "mpi-tf_keras", "ring-keras3"],
)
def test_horovods_own_test_cases_hold(engine: str, legacy: str) -> None:
    """What Horovod 0.28.1's test suite checks and mldist.horovod used to get wrong (see the worker)."""
    worker = str(WORKERS / "hvd_conformance.py")
    run = ["run", "-n", "2", "--communication", engine, "--", PY, worker]
    rows = results(check(mldist(run, 180, env=clean_env(TF_USE_LEGACY_KERAS=legacy))).stdout)
    assert len(rows) == 2 and rows[0]["checks"] == rows[1]["checks"]
    assert len(rows[0]["checks"]) == 27, rows[0]["checks"]


#: The worker uses no Keras layers: tf_keras only where a TensorFlow 1 session holds Keras-free variables.
GRAPH_CASES = [("eager", "0"), ("function", "0"), ("v1", "0"), ("v1", "1")]


@pytest.mark.parametrize(("mode", "legacy"), GRAPH_CASES, ids=["eager", "function", "v1", "v1-tf_keras"])
def test_many_collectives_in_one_graph_agree_on_every_rank(mode: str, legacy: str) -> None:
    """Horovod's fused tests: 30 collectives evaluated at once; a TensorFlow 1 session runs them in any order."""
    worker = [PY, str(WORKERS / "hvd_graph.py"), mode]
    env = clean_env(TF_USE_LEGACY_KERAS=legacy)
    rows = results(check(mldist(["run", "-n", "2", "--communication", "mpi", "--", *worker], 180, env=env)).stdout)
    assert [row["ok"] for row in rows] == [[True] * 3] * 2
    if mode == "v1":  # object collectives and variables inside the session, too
        assert [row["objects"] for row in rows] == [[{"from": 1}, [0, 1], [1.0]]] * 2


def test_refused_features_say_what_to_use_instead() -> None:
    res = check(run_py(API, "refusals", timeout=120))
    refused = dict(line.split(": ", 1) for line in res.stdout.splitlines() if line.startswith("REFUSED "))
    expected = {
        "v1_optimizer": "Keras optimizer",
        "global_variables": "broadcast_variables",
        "init_sub_world": "-n 3",
        "horovod_torch": "TensorFlow and Keras API only",
        "not_initialized": "hvd.init()",
    }
    assert sorted(refused) == sorted(f"REFUSED {k}" for k in expected)
    for key, fix in expected.items():
        assert fix in refused[f"REFUSED {key}"], (key, refused[f"REFUSED {key}"])
    assert "PATHS-OK" in res.stdout
