"""mldist.horovod function by function: 2 and 3 real workers on both engines, refusals, mismatches."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

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
    "bf16-compression",
    "tape-predivide",
    "tape-sum",
)


def expected(graph_dtypes: tuple[str, ...] = DTYPES) -> list[str]:
    """Every check the worker must have passed, in order: a skipped check fails the test."""
    modes = [
        (dtype, mode) for dtype in DTYPES for mode in ("eager", "graph") if mode == "eager" or dtype in graph_dtypes
    ]
    return [f"{name}-{dtype}-{mode}" for (dtype, mode), name in itertools.product(modes, PER_DTYPE)] + list(ONCE)


pytestmark = pytest.mark.slow


# RING with 2 workers and the MPI engine with 3 (an odd world, in a launch shared with the process-set
# checks): both engines and both an even and an odd world, in two TensorFlow start-ups per rank.
# On RING, inside a tf.function only float32: an eager collective runs as a tf.function there too
# (one per signature), so every dtype already goes through the same traced collective; each graph
# check traces a new function: 35.6 -> 25.4 CPU-s for the launch here.
def test_every_function_matches_numpy_on_2_ring_workers() -> None:
    res = check(mldist(["run", "-n", "2", "--communication", "ring", "--", PY, API, "collectives", "float32"], 300))
    _every_function_matches(results(res.stdout), 2, "ring", expected(("float32",)))


def test_every_function_matches_numpy_on_3_mpi_workers(shared_hvd: Callable[[str, str], str]) -> None:
    _every_function_matches(results(shared_hvd("keras3-3", "hvd_api.py collectives")), 3, "mpi", expected())


def _every_function_matches(rows: list[dict[str, Any]], workers: int, engine: str, checks: list[str]) -> None:
    assert [r["rank"] for r in rows] == list(range(workers))
    for row in rows:
        assert row["size"] == workers
        assert row["checks"] == checks
        cross_rank, cross_size, homogeneous, mpi = row["info"]
        assert (cross_rank, cross_size, homogeneous, mpi) == (0, 1, True, engine == "mpi")


# Shapes that differ across ranks in one uncaught all-reduce (hvd.allreduce is mldist.allreduce there)
# are runtime/test_engine.py's shape-mismatch rows, on both engines; Horovod's own errors are here.
@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_mismatches_raise_horovods_errors_on_every_rank_and_the_ranks_go_on(
    flavour: str, shared_hvd: Callable[[str, str], str]
) -> None:
    rows = results(shared_hvd(flavour, "hvd_errors.py"))
    assert [row["caught"] for row in rows] == [["shape", "dtype", "root", "allgather", "grouped", "graph"]] * 2
    assert [row["after"] for row in rows] == [[3.0], [3.0]]


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"], ids=["mpi-keras3", "mpi-tf_keras"])
def test_horovods_own_test_cases_hold(flavour: str, shared_hvd: Callable[[str, str], str]) -> None:
    """What Horovod 0.28.1's test suite checks and mldist.horovod used to get wrong (see the worker)."""
    _conformance(results(shared_hvd(flavour, "hvd_conformance.py")))


def test_horovods_own_test_cases_hold_on_ring() -> None:
    """The same on the RING engine (the worker uses no Keras: one flavour is enough)."""
    run = ["run", "-n", "2", "--communication", "ring", "--", PY, str(WORKERS / "hvd_conformance.py")]
    _conformance(results(check(mldist(run, 180)).stdout))


def _conformance(rows: list[dict[str, Any]]) -> None:
    assert len(rows) == 2 and rows[0]["checks"] == rows[1]["checks"]
    assert len(rows[0]["checks"]) == 32, rows[0]["checks"]


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_many_collectives_in_one_graph_agree_on_every_rank(mode: str, shared_hvd: Callable[[str, str], str]) -> None:
    """Horovod's fused tests: 30 collectives built at once, evaluated together three times."""
    rows = results(shared_hvd("keras3", f"hvd_graph.py {mode}"))
    assert [row["ok"] for row in rows] == [[True] * 3] * 2


#: The worker uses no Keras layers: tf_keras only where a TensorFlow 1 session holds Keras-free variables.
@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_many_collectives_in_a_tensorflow_1_session_agree_on_every_rank(legacy: str) -> None:
    """A TensorFlow 1 session runs the 30 collectives in any order; object collectives and variables too.

    Its own launch: eager execution goes off before mldist starts, for the whole process.
    """
    worker = [PY, str(WORKERS / "hvd_graph.py"), "v1"]
    env = clean_env(TF_USE_LEGACY_KERAS=legacy)
    rows = results(check(mldist(["run", "-n", "2", "--communication", "mpi", "--", *worker], 180, env=env)).stdout)
    assert [row["ok"] for row in rows] == [[True] * 3] * 2
    assert [row["objects"] for row in rows] == [[{"from": 1}, [0, 1], [1.0]]] * 2
    failed = {"other_size": "FailedPreconditionError", "other_shape": "FailedPreconditionError"}
    failed["other_dtype"] = "FailedPreconditionError"
    for r, row in enumerate(rows):  # as in Horovod's own graph-mode tests
        assert {k: row["graph"][k] for k in failed} == failed, row["graph"]
        assert row["graph"]["agree_after"] == [2.0, 2.0]
        assert row["graph"]["broadcast_inplace"] == [[1.0, 1.0], [1.0, 1.0]]
        assert row["graph"]["global_variables"] == [5.0, 5.0]
        assert row["graph"]["broadcast_grad"] == ([1.0, 1.0] if r == 0 else [0.0, 0.0])


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


def test_the_optimizer_internals_horovods_keras_tests_read(shared_hvd: Callable[[str, str], str]) -> None:
    """_compute_gradients reduces (once), _agg_helper.counter and iterations count every call."""
    rows = results(shared_hvd("tf_keras", "hvd_optimizer_internals.py"))
    for row in rows:
        assert (row["reduced"], row["applied"]) == (1.5, 1.5), row
        # Sums of 2 passes of the average 1.5 every 2 calls (3.0), or their mean (1.5).
        assert row["steps"]["False"] == [[0.0, 1, 1], [3.0, 0, 2], [3.0, 1, 3]], row
        assert row["steps"]["True"] == [[0.0, 1, 1], [1.5, 0, 2], [1.5, 1, 3]], row
