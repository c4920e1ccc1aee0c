"""A numpy-only worker imports what its script uses (issue 62): no TensorFlow, no JAX (nor ml_dtypes,
which took a loaded node 3 s to load for the bfloat16 sum), numpy back."""

from __future__ import annotations

from helpers import PY, WORKERS, check, mldist, results, run_py

WORKER = str(WORKERS / "numpy_only.py")


def test_a_numpy_worker_under_the_mpi_engine_imports_neither_tensorflow_nor_jax() -> None:
    res = check(mldist(["run", "-n", "2", "--communication", "mpi", "--no-run-dir", "--", PY, WORKER], timeout=180))
    rows = results(res.stdout)
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        assert (row["size"], row["engine"], row["imported"]) == (2, "mpi", [])
        # numpy in, numpy out; a numpy scalar stays one, a Python number stays a Python number.
        assert row["types"] == ["ndarray", "float32", "ndarray", "int", "ndarray", "ndarray", "float", "ndarray"]
        assert row["dtypes"] == ["float64", "float32", "float16", "bool", "int64", "int32"]
        assert row["sum"] == [1.0, 3.0, 5.0]  # (0, 1, 2) + (1, 2, 3)
        assert row["mean"] == [0.5, [[1.5, 1.5], [1.5, 1.5]]]
        assert (row["max"], row["min"]) == (6, [False, True])
        assert row["bcast"] == [[0, 2, 4, 6], 15.0]  # rank 1's values everywhere
        assert row["gather"] == [[0, 0], [1, 1], [1, 1]]  # 1 row from rank 0, 2 from rank 1


def test_a_numpy_worker_alone_gets_its_own_values_back() -> None:
    (row,) = results(check(run_py(WORKER)).stdout)
    assert (row["size"], row["engine"], row["imported"]) == (1, "none", [])
    assert row["types"] == ["ndarray", "float32", "ndarray", "int", "ndarray", "ndarray", "float", "ndarray"]
    assert (row["sum"], row["max"], row["gather"]) == ([0.0, 1.0, 2.0], 5, [[0, 0]])
