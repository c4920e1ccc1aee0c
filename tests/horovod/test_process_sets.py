"""Horovod's process sets on the MPI engine (3 real ranks), and their one-line refusal on RING."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from helpers import PY, WORKERS, check, clean_env, mldist, results

pytestmark = pytest.mark.slow
WORKER = str(WORKERS / "hvd_process_sets.py")


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_collectives_over_a_process_set_and_the_world_around_it(
    flavour: str, shared_hvd: Callable[[str, str], str]
) -> None:
    if flavour == "keras3":  # in the 3-rank launch shared with other checks
        stdout = shared_hvd("keras3-3", "hvd_process_sets.py")
    else:
        run = ["run", "-n", "3", "--communication", "mpi", "--", PY, WORKER]
        stdout = check(mldist(run, timeout=240, env=clean_env(TF_USE_LEGACY_KERAS="1"))).stdout
    rows = results(stdout)
    r0, r1, r2 = rows
    assert {tuple(row["ids"]) for row in rows} == {(1, 2)}
    for row, place in ((r0, 0), (r2, 1)):
        assert (row["sum"], row["average"], row["gather"]) == ([4.0], [2.0], [[0], [2]])  # ranks 0 and 2 only
        assert (row["bcast"], row["object"], row["set"]) == ([2], {"from": 2}, [2, place, 2])
        assert (row["traced"], row["tape"]) == ([2.0], [2.0])  # in a tf.function; mean gradient of 1 and 3
    assert "rank 1 is not in ProcessSet(process_set_id=1, ranks=[0, 2])" in str(r1["outside"])
    assert r1["alone"] == [5.0]
    assert [row["world"] for row in rows] == [[3.0]] * 3 and [row["removed"] for row in rows] == [[True, False]] * 3


def test_process_sets_on_ring_name_the_mpi_engine() -> None:
    res = check(mldist(["run", "-n", "2", "--communication", "ring", "--", PY, WORKER], timeout=180), 1)
    lines = [line for line in res.stderr.splitlines() if "mldist: error" in line]
    assert lines and all("process sets need the MPI engine" in line for line in lines), res.stderr[-2000:]
