"""Horovod's timeline, tuning variables, the Keras callbacks' extra arguments and elastic state, on 2 ranks."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_local_layers_keep_their_gradients(flavour: str, shared_hvd: Callable[[str, str], str]) -> None:
    rows = results(shared_hvd(flavour, "hvd_partial.py"))
    assert [row["tape"] for row in rows] == [[1.5, 0.5], [1.5, 1.0]]  # mean of 1 and 2; own x / 2
    assert [row["split"] for row in rows] == [[[0.5], [1.5]], [[1.0], [1.5]]]  # get_local_and_global_gradients
    assert all(row["split_sources"] == [True, True] for row in rows)
    assert rows[0]["fit_shared"] == rows[1]["fit_shared"]  # averaged gradients: the same everywhere
    assert rows[0]["fit_local"] != rows[1]["fit_local"]  # each rank's own data moves its own layer


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_join_with_uneven_data_as_in_horovod(flavour: str, shared_hvd: Callable[[str, str], str]) -> None:
    r0, r1 = results(shared_hvd(flavour, "hvd_join.py"))
    # Loop: 2 common steps of mean gradient 2 (w = -3), then rank 1 alone with 3 / 2 twice (w = -6).
    assert (r0["loop_w"], r1["loop_w"]) == (-3.0, -6.0)
    assert r0["loop_last"] == r1["loop_last"] == 1 and r0["fit_last"] == r1["fit_last"] == 1
    assert r1["average"] == [1.0, 2.0]  # Horovod's own join test: tensor * (size - 1) / size
    assert r1["average_bf16"] == [1.0, 2.0]  # the same, sent as bfloat16
    assert r1["broadcast_failed"] is True


def test_elastic_state_resumes_exactly_after_kill_9(tmp_path: Path) -> None:
    """hvd.elastic on a fixed world: a rank killed with SIGKILL, the group restarted from the last commit.

    Keras 3 here (its optimizer state is what Horovod cannot restore); test_examples.py's elastic MNIST
    runs the same restart with tf_keras: two launches of 2 workers each save 30 s of CI time.
    """
    env = clean_env(TF_USE_LEGACY_KERAS="0")
    # The killed run keeps its commits in this host's memory too, as an elastic run does (mldist.checkpoint.commits).
    shm = tmp_path / "shm"
    memory = {"MLDIST_ELASTIC_ID": "kill9", "MLDIST_COMMITS_DIR": str(shm)}
    runs, out = {}, {}
    for mode in ("whole", "kill"):
        args = ["run", "-n", "2", "--communication", "mpi", "--max-restarts", "1", "--run-dir", str(tmp_path / mode)]
        argv = [*args, "--", PY, str(WORKERS / "hvd_elastic.py"), mode]
        res = check(mldist(argv, env={**env, **(memory if mode == "kill" else {})}, timeout=300))
        runs[mode], out[mode] = results(res.stdout), res.stdout
    assert "restarting the group (1 of 1)" in res.stderr
    assert re.search(r"mldist: elastic: resumed: commit 2 from rank 0, in \S+'s memory; 2 worker", res.stderr)
    mine = shm / f"mldist-{os.getuid()}"
    assert mine.stat().st_mode & 0o077 == 0 and not list(mine.rglob("*.pkl"))  # owner-only; gone after the run
    assert [row["restart"] for row in runs["kill"]] == ["1", "1"] and [row["resets"] for row in runs["kill"]] == [
        [2]
    ] * 2
    for row in runs["kill"]:  # weights and momentum came back: the same weights as without the kill
        for got, want in zip(row["weights"], runs["whole"][0]["weights"], strict=True):
            assert np.allclose(got, want, rtol=1e-6, atol=1e-7)
    assert (tmp_path / "kill" / "elastic-state.pkl").stat().st_mode & 0o077 == 0  # owner-only
    # The whole run also went through Horovod's elastic Keras callbacks in fit.
    calls = [json.loads(line.split("CALLBACKS ", 1)[1]) for line in out["whole"].splitlines() if "CALLBACKS " in line]
    assert sorted((c["rank"], c["epoch"], c["batch"]) for c in calls) == [(0, 3, 0), (1, 3, 0)]
