"""Scripts written for Keras's, TensorFlow's or JAX's own distribution API, unchanged under mldist's
launchers; and a group that never forms, said at the end of the run.

The Keras guide's DataParallel (tests/workers/keras_guide.py) under ``mldist run -n 2`` (alone and
mixed with ``mldist.init()`` in either order, or with JAX's own ``jax.distributed.initialize()`` instead
of Keras's) and under ``srun -N 2`` (tests/slurm) must equal one
process on the union batch. TensorFlow's multi-worker tutorial (tests/workers/tf_multiworker.py)
trains under ``mldist run --tf-config``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import PY, WORKERS, check, clean_env, mldist, results, run_py

pytestmark = pytest.mark.slow

JAX = clean_env(KERAS_BACKEND="jax")
NEVER = "never formed a group"


@pytest.fixture(scope="module")
def guide_alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guide in one process (no launcher: Keras's initialize() finds no cluster): the reference weights."""
    out = tmp_path_factory.mktemp("guide-one")
    res = check(run_py(str(WORKERS / "keras_guide.py"), str(out), env=JAX, timeout=240))
    assert results(res.stdout) == [{"rank": 0, "processes": 1, "devices": 1}]
    assert "initialization skipped or failed" in res.stdout  # the guide's own line, in one process
    return out


def same_as_one_process(two: Path, one: Path) -> None:
    """Both ranks end with identical weights, equal to one process on the union batch."""
    w0, w1, ref = np.load(two / "weights-0.npy"), np.load(two / "weights-1.npy"), np.load(one / "weights-0.npy")
    assert np.array_equal(w0, w1)
    assert np.linalg.norm(w0 - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("order", ["keras", "mldist-first", "keras-first", "jax"])
def test_the_keras_guide_forms_one_group_under_mldist_run(tmp_path: Path, guide_alone: Path, order: str) -> None:
    run_dir = tmp_path / "run"
    argv = ["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, str(WORKERS / "keras_guide.py"), str(tmp_path)]
    res = check(mldist([*argv, order], env=JAX, timeout=240))
    assert sorted(r["rank"] for r in results(res.stdout)) == [0, 1]
    assert all((r["processes"], r["devices"]) == (2, 2) for r in results(res.stdout)), res.stdout
    assert "skipped or failed" not in res.stdout + res.stderr and NEVER not in res.stderr
    same_as_one_process(tmp_path, guide_alone)
    summary = json.loads((run_dir / "summary.json").read_text())
    how = "mldist.init" if "first" in order else "jax.distributed"  # mldist.init() joined the same group
    assert summary["group"] == {"0": how, "1": how} and "never_formed" not in summary


def test_a_script_that_never_joins_is_named_recorded_and_fails_when_required(tmp_path: Path) -> None:
    alone = ["--", PY, "-c", "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"]
    run_dir = tmp_path / "run"
    res = check(mldist(["run", "-n", "2", "--run-dir", str(run_dir), *alone], env=clean_env()))
    lines = [line for line in res.stderr.splitlines() if NEVER in line]
    assert lines == [
        "mldist run: the 2 workers never formed a group (no mldist.init(), hvd.init() or "
        "keras.distribution.initialize()); each trained on its own; --require-group makes this an error"
    ], res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["group"] == {"0": "alone", "1": "alone"} and NEVER in summary["never_formed"]
    assert summary["exit_code"] == 0
    strict = mldist(["run", "-n", "2", "--no-run-dir", "--require-group", *alone], env=clean_env())
    assert strict.returncode == 1 and "error: the 2 workers never formed a group" in strict.stderr, strict.stderr
    by_variable = mldist(["run", "-n", "2", "--no-run-dir", *alone], env=clean_env(MLDIST_REQUIRE_GROUP="1"))
    assert by_variable.returncode == 1 and "failing the run" in by_variable.stderr
    # Switched off, the hook leaves no note and the launcher says nothing.
    off = check(mldist(["run", "-n", "2", "--no-run-dir", *alone], env=clean_env(MLDIST_HOOK="0")))
    assert NEVER not in off.stderr


def test_the_readme_example_never_gets_the_line(digits_run: Path) -> None:
    summary = json.loads((digits_run / "summary.json").read_text())
    assert summary["group"] == {"0": "mldist.init", "1": "mldist.init"} and "never_formed" not in summary
    assert NEVER not in (digits_run.parent / "stderr.txt").read_text()


def test_tensorflow_multi_worker_tutorial_runs_with_tf_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["run", "-n", "2", "--tf-config", "--run-dir", str(run_dir), "--", PY, str(WORKERS / "tf_multiworker.py")]
    res = check(mldist([*argv, str(tmp_path)], env=clean_env(TF_USE_LEGACY_KERAS="1"), timeout=300))
    assert [(r["rank"], r["replicas"]) for r in results(res.stdout)] == [(0, 2), (1, 2)]
    assert np.array_equal(np.load(tmp_path / "weights-0.npy"), np.load(tmp_path / "weights-1.npy"))
    assert "keras#20585" not in res.stderr  # TF-Keras: nothing to warn about
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["group"] == {"0": "tf.distribute", "1": "tf.distribute"}


def test_tf_config_per_rank_and_the_keras_3_line() -> None:
    show = "import os; c = os.environ['TF_CONFIG']; print('RESULT', c[:-1] + ', \"rank\": ' + os.environ['RANK'] + '}')"
    res = check(mldist(["run", "-n", "2", "--tf-config", "--no-run-dir", "--", PY, "-c", show], env=clean_env()))
    configs = results(res.stdout)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 2
    notes = [line for line in res.stderr.splitlines() if "keras#20585" in line]
    assert len(notes) == 1 and "mldist.keras.DistributedOptimizer" in notes[0] and "KERAS_BACKEND=jax" in notes[0]
    plain = check(
        mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", "import os; print('TF_CONFIG' in os.environ)"])
    )
    assert "[0] False" in plain.stdout and "keras#20585" not in plain.stderr


def test_the_variables_other_tools_read(tmp_path: Path) -> None:
    names = [
        "rank",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "KERAS_DISTRIBUTION_NUM_PROCESSES",
        "KERAS_DISTRIBUTION_PROCESS_ID",
    ]
    show = (
        f"import os, json; print('RESULT', json.dumps({{n: os.environ.get(n, os.environ['RANK']) for n in {names!r}}}))"
    )
    res = check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", show], env=clean_env()))
    rows = results(res.stdout)
    assert [list(r.values()) for r in rows] == [["0", "0", "2", "0", "2", "0"], ["1", "1", "2", "1", "2", "1"]]
