"""Horovod's timeline, tuning variables and the Keras callbacks' extra arguments, on 2 ranks, both Keras modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import PY, WORKERS, check, clean_env, mldist, results

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_timeline_fusion_threshold_and_callbacks(legacy: str, tmp_path: Path) -> None:
    # Keras 3: start_timeline/stop_timeline around 3 all-reduces; tf_keras: horovodrun's --timeline-filename
    # (HOROVOD_TIMELINE), the whole run, with its other flags.
    timeline = legacy == "1"
    env = clean_env(TF_USE_LEGACY_KERAS=legacy, HOROVOD_FUSION_THRESHOLD="0", HOROVOD_CYCLE_TIME="5")
    flags = ["--timeline-filename", str(tmp_path / "whole.json"), "--log-level", "WARNING", "--start-timeout", "30"]
    flags += ["--mpi-args", "-x MLDIST_TEST_MPI_ARG=given"]
    worker = [PY, str(WORKERS / "hvd_features.py"), str(tmp_path)]
    run = ["run", "-n", "2", "--communication", "mpi", *(flags if timeline else []), "--", *worker]
    res = check(mldist(run, env=env, timeout=240))
    rows = results(res.stdout)
    if timeline:
        assert [row["mpi_arg"] for row in rows] == ["given", "given"]  # --mpi-args reached mpiexec
        assert "--start-timeout has no effect" in res.stderr
    assert [row["fused_calls"] for row in rows] == [3, 3]  # threshold 0: one collective per tensor (default: 1)
    assert [row["best_written"] for row in rows] == [True, False]  # rank 0 writes the best model
    assert [row["shared"] for row in rows] == [[1.0], [1.0]]  # rank 0's values...
    assert [row["local"] for row in rows] == [[5.0], [6.0]]  # ...except the local variables
    assert res.stderr.count("HOROVOD_CYCLE_TIME have no effect in mldist") == 1, res.stderr[-2000:]
    events = json.loads((tmp_path / ("whole.json" if timeline else "part.json")).read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    assert any("allreduce" in e["name"] for e in events if e.get("ph") == "X")
    if timeline:  # the whole run: the training steps too
        assert any("Sequential" in e["name"] or "sequential" in e["name"] for e in events)


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_local_layers_keep_their_gradients(legacy: str) -> None:
    env = clean_env(TF_USE_LEGACY_KERAS=legacy)
    worker = [PY, str(WORKERS / "hvd_partial.py")]
    rows = results(
        check(mldist(["run", "-n", "2", "--communication", "mpi", "--", *worker], env=env, timeout=240)).stdout
    )
    assert [row["tape"] for row in rows] == [[1.5, 0.5], [1.5, 1.0]]  # mean of 1 and 2; own x / 2
    assert rows[0]["fit_shared"] == rows[1]["fit_shared"]  # averaged gradients: the same everywhere
    assert rows[0]["fit_local"] != rows[1]["fit_local"]  # each rank's own data moves its own layer
