"""Checkpoints, resume, preemption and restarts.

The file format is tested in-process; everything about training runs 2 real
workers of tests/workers/resume.py under ``mldist run`` (16 steps per epoch).
The launcher's own restart logic (tiny shell workers) is in launch/test_restarts.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import BACKEND_ENGINES, PY, USERS_GC, WORKERS, check, clean_env, engine_launch, mldist
from mldist.checkpoint import CheckpointManager
from mldist.checkpoint.format import MANIFEST, STATE, checkpoints, latest_valid, read_checkpoint, write_checkpoint
from mldist.errors import CheckpointError

WORKER = str(WORKERS / "resume.py")
STEPS_PER_EPOCH = 16


# -- the format ----------------------------------------------------------------------------------


def _write(directory: Path, step: int) -> Path:
    arrays = {"model.0": np.full((3, 2), step, np.float32), "model.1": np.arange(step, dtype=np.int64)}
    return write_checkpoint(directory, step, arrays, {"extra": {"epoch": step}, "objects": {}})


def test_written_checkpoint_has_manifest_with_checksum_and_no_temp_files(tmp_path: Path) -> None:
    path = _write(tmp_path, 7)
    assert path.name == "ckpt-0000000007"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000007"]
    manifest, arrays = read_checkpoint(path)
    assert manifest["step"] == 7 and manifest["extra"] == {"epoch": 7}
    assert manifest["files"][STATE]["bytes"] == (path / STATE).stat().st_size
    assert arrays["model.0"].tolist() == [[7, 7]] * 3 and arrays["model.1"].tolist() == list(range(7))


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-manifest", "bad-json"])
def test_damaged_newest_checkpoint_is_named_and_the_previous_one_used(damage: str, tmp_path: Path) -> None:
    _write(tmp_path, 1)
    newest = _write(tmp_path, 2)
    state = newest / STATE
    data = state.read_bytes()
    if damage == "truncate":
        state.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        state.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "no-manifest":
        (newest / MANIFEST).unlink()
    else:
        (newest / MANIFEST).write_text('{"step": 2, "files": ')
    with pytest.warns(UserWarning, match=str(newest)):
        found = latest_valid(tmp_path)
    assert found is not None and found[0]["step"] == 1


def test_all_damaged_means_none(tmp_path: Path) -> None:
    (_write(tmp_path, 3) / STATE).write_bytes(b"")
    with pytest.warns(UserWarning, match="truncated"):
        assert latest_valid(tmp_path) is None
    assert latest_valid(tmp_path / "missing") is None


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    _write(tmp_path, 5)
    write_checkpoint(tmp_path, 5, {"x": np.zeros(1)}, {})
    assert [s for s, _ in checkpoints(tmp_path)] == [5]
    assert list(read_checkpoint(tmp_path / "ckpt-0000000005")[1]) == ["x"]


@pytest.mark.filterwarnings("ignore:mldist.init.. came after")  # other tests ran TF ops in this process
def test_manager_round_trip_keeps_the_last_n_and_refuses_other_shapes(tmp_path: Path) -> None:
    import tensorflow as tf

    a, b = tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64)
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20, 30):
        a.assign([step, step + 1.0])
        mgr.save(step, extra={"epoch": step // 10}, model=[a], counter=b)
    assert [s for s, _ in checkpoints(tmp_path)] == [20, 30]
    manifest = json.loads((tmp_path / "ckpt-0000000030" / MANIFEST).read_text())
    assert set(manifest["versions"]) >= {"mldist", "tensorflow", "keras", "python"}
    a.assign([0.0, 0.0])
    assert mgr.restore(model=[a], counter=b) == 30
    assert a.numpy().tolist() == [30.0, 31.0] and mgr.restored_extra == {"epoch": 3}
    # Every checkpoint is sound but of another model: an error (starting afresh would mix two runs).
    with pytest.raises(CheckpointError, match="model changed"), pytest.warns(UserWarning, match="does not fit"):
        mgr.restore(model=[tf.Variable([1.0, 2.0, 3.0])], counter=b)
    assert CheckpointManager(tmp_path / "empty").restore(model=[a]) == 0


# -- 2 real workers ------------------------------------------------------------------------------


def _run(out: Path, *worker_args: str, engine: str, launcher: tuple[str, ...] = (), timeout: float = 240) -> Any:
    out.mkdir(parents=True, exist_ok=True)
    chosen, env = engine_launch(engine)
    argv = ["run", "-n", "2", *chosen, *launcher, "--", PY, WORKER, str(out), *worker_args]
    return mldist(argv, timeout=timeout, env=env)


def _epochs(out: Path, rank: int = 0) -> list[dict[str, int]]:
    lines = (out / f"epochs-rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _weights(out: Path) -> np.ndarray:
    w0, w1 = np.load(out / "weights-rank0.npy"), np.load(out / "weights-rank1.npy")
    assert np.array_equal(w0, w1), "ranks ended with different weights"
    return w0


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", params=BACKEND_ENGINES)
def ref_engine(request: pytest.FixtureRequest) -> str:
    """The engine of the reference run and of the tests compared with it."""
    return str(request.param)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``ref(engine)``: the folder of an uninterrupted 2-worker run of 4 epochs (checkpoints at steps 32,
    48, 64), run once per Keras backend. MPI and RING end with bit-identical weights, so the TensorFlow
    run (on MPI) is RING's reference too: the RING tests check against the other engine."""
    done: dict[str, Path] = {}

    def ref(engine: str) -> Path:
        engine = "jax" if engine == "jax" else "mpi"
        if engine not in done:
            out = tmp_path_factory.mktemp(f"reference-{engine}")
            check(_run(out, "--epochs", "4", engine=engine))
            assert [e["epoch"] for e in _epochs(out)] == [0, 1, 2, 3]
            done[engine] = out
        return done[engine]

    return ref


@pytest.fixture
def reference(references: Callable[[str], Path], ref_engine: str) -> Path:
    """The reference run of ``ref_engine``'s backend (:func:`references`)."""
    return references(ref_engine)


@pytest.mark.slow
# Not on MPI: a SIGKILLed rank and --max-restarts on the MPI engine are in test_features.py's exact
# elastic resume, and the Keras checkpoint's resume is the same on every engine.
@pytest.mark.parametrize("ref_engine", ["ring", "jax"], indirect=True)
def test_sigkilled_worker_restarts_from_the_last_checkpoint_and_matches(
    reference: Path, ref_engine: str, tmp_path: Path
) -> None:
    # Rank 1 kills itself before step 40 (epoch 2, batch 8); the last checkpoint is step 32.
    r = check(_run(tmp_path, "--epochs", "4", "--kill-at", "40", engine=ref_engine, launcher=("--max-restarts", "1")))
    assert "restarting the group (1 of 1) after: rank 1 was killed by SIGKILL" in r.stderr
    records = _epochs(tmp_path, rank=1)
    first = [(e["epoch"], e["step"]) for e in records if e["attempt"] == 0]
    second = [(e["epoch"], e["step"]) for e in records if e["attempt"] == 1]
    assert first == [(0, 0), (1, 16), (2, 32)]
    assert second == [(2, 32), (3, 48)], "the restart must begin at the epoch after the last checkpoint"
    assert _rel(_weights(tmp_path), _weights(reference)) <= 1e-5


@pytest.mark.slow
# Not on RING: the ranks' agreement on a signal, the save and exit 75 there are in the custom-loop
# test below, and the Keras checkpoint's mid-epoch resume is the same on every engine.
@pytest.mark.parametrize("ref_engine", ["mpi", "jax"], indirect=True)
def test_sigterm_saves_mid_epoch_exits_75_and_resumes_at_that_step(
    reference: Path, ref_engine: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    grace = 30
    chosen, env = engine_launch(ref_engine)
    argv = [PY, "-m", "mldist", "run", "-n", "2", *chosen, "--grace", str(grace)]
    argv += ["--", PY, WORKER, str(out)]
    argv += ["--epochs", "4", "--sleep", "0.1", "--check-every", "4"]
    log = (tmp_path / "launcher.log").open("w+")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env={**env, **USERS_GC})
    try:
        deadline = time.monotonic() + 180
        while "step 37 done" not in (tmp_path / "launcher.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.1)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=grace + 30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "launcher.log").read_text()
    assert code == 75, text[-3000:]
    assert took < grace, f"exit after {took:.1f} s, grace {grace} s"
    saved = [s for s, _ in checkpoints(out / "ckpt")]
    assert saved and saved[-1] % STEPS_PER_EPOCH != 0, f"no mid-epoch checkpoint: {saved}"
    step = saved[-1]
    r = check(_run(out, "--epochs", "4", engine=ref_engine))
    resumed = _epochs(out)[len([e for e in _epochs(out) if e["step"] < step]) :]
    assert resumed[0] == {"attempt": 0, "epoch": step // STEPS_PER_EPOCH, "step": step}
    assert f"resuming from checkpoint step {step}: epoch {step // 16}, batch {step % 16}" in r.stderr
    # Exact-step resume: the same batches in the same order as the uninterrupted run.
    assert _rel(_weights(out), _weights(reference)) <= 1e-5


#: One damage per backend on real workers (the format tests above cover every damage in-process).
#: Not on RING: rank 0 reads and broadcasts as on MPI, and the RING broadcast of a restore is in the
#: SIGKILL restart above.
DAMAGE = {"mpi": "flip", "jax": "truncate"}


@pytest.mark.slow
@pytest.mark.parametrize("ref_engine", list(DAMAGE), indirect=True)
def test_corrupted_latest_checkpoint_is_skipped_with_a_warning(
    reference: Path, ref_engine: str, tmp_path: Path
) -> None:
    damage = DAMAGE[ref_engine]
    shutil.copytree(reference / "ckpt", tmp_path / "ckpt")
    state = tmp_path / "ckpt" / "ckpt-0000000064" / STATE
    data = state.read_bytes()
    state.write_bytes(data[:-1000] if damage == "truncate" else data[:500] + bytes([data[500] ^ 0x55]) + data[501:])
    # Rank 1 sees only an empty directory of its own: rank 0 reads and broadcasts.
    r = check(_run(tmp_path, "--epochs", "5", "--private-ckpt", engine=ref_engine))
    assert f"skipping damaged checkpoint: {state}" in r.stderr
    for rank in (0, 1):
        assert [(e["epoch"], e["step"]) for e in _epochs(tmp_path, rank)] == [(3, 48), (4, 64)]
    assert not list((tmp_path / "ckpt-private-rank1").glob("ckpt-*")), "only rank 0 writes"
    assert os.path.exists(tmp_path / "ckpt" / "model.keras")


def _custom_loop_weights(steps: int = 30) -> np.ndarray:
    """What tests/workers/custom_loop.py computes on 2 ranks, in numpy (float64): ``steps`` SGD steps
    (rate 0.05) on the mean of both ranks' gradients of the mean squared error."""
    w, b = np.zeros((4, 1)), np.zeros(1)
    for step in range(1, steps + 1):
        grads = []
        for rank in (0, 1):
            x = np.random.default_rng(step * 10 + rank).normal(size=(8, 4)).astype(np.float32).astype(np.float64)
            err = x @ w + b - x.sum(axis=1, keepdims=True)  # d/d(x @ w + b) of mean(err ** 2) is 2 * err / 8
            grads.append((2 * x.T @ err / len(x), 2 * err.sum(axis=0) / len(x)))
        (gw0, gb0), (gw1, gb1) = grads
        w, b = w - 0.05 * (gw0 + gw1) / 2, b - 0.05 * (gb0 + gb1) / 2
    return np.concatenate([w.ravel(), b])


@pytest.mark.slow
def test_custom_loop_signal_on_one_rank_saves_on_both_and_resumes(tmp_path: Path, engine: str) -> None:
    loop = str(WORKERS / "custom_loop.py")

    def run(out: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
        out.mkdir(exist_ok=True)
        argv = ["run", "-n", "2", "--communication", engine, "--", PY, loop, str(out), *extra]
        return mldist(argv, timeout=180, env=env)

    # Only rank 1 gets SIGUSR1, before step 12: the ranks agree at step 12 and both exit 75.
    cut = check(run(tmp_path / "cut", "12", env=clean_env(**USERS_GC)), 75)
    assert "[0] rank 0 saved at step 12; exiting 75" in cut.stdout
    assert "[1] rank 1 saved at step 12; exiting 75" in cut.stdout
    resumed = check(run(tmp_path / "cut"))
    assert "[0] rank 0 starts at step 12" in resumed.stdout and "[1] rank 1 starts at step 12" in resumed.stdout
    final = [np.load(tmp_path / "cut" / f"final-rank{r}.npy") for r in (0, 1)]
    assert np.array_equal(final[0], final[1])
    # As if never cut: the same 30 steps computed without TensorFlow (float32 there, float64 here).
    assert _rel(final[0], _custom_loop_weights()) <= 1e-5


@pytest.mark.slow
def test_custom_loop_resumes_from_the_previous_checkpoint_when_the_newest_is_hostile(tmp_path: Path) -> None:
    loop = str(WORKERS / "custom_loop.py")

    def run(*extra: str) -> Any:
        argv = ["run", "-n", "2", "--communication", "ring", "--", PY, loop, str(tmp_path), *extra]
        return mldist(argv, timeout=180)

    check(run("12"), 75)  # saves at steps 5, 10 and 12; keep=2 leaves 10 and 12
    assert [s for s, _ in checkpoints(tmp_path / "ckpt")] == [10, 12]
    # Between the runs step 12 is rewritten with a valid checksum but a 'params' array of another shape
    # than its manifest (and the model) says: restore used to assign it and die with a ValueError.
    newest = tmp_path / "ckpt" / "ckpt-0000000012"
    manifest = json.loads((newest / MANIFEST).read_text())
    with np.load(newest / STATE, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files} | {"params.0": np.zeros((5, 1), np.float32)}
    write_checkpoint(tmp_path / "ckpt", 12, arrays, {k: v for k, v in manifest.items() if k != "files"})
    r = check(run())
    assert f"skipping damaged checkpoint: {newest / STATE} holds array 'params.0' as float32 (5, 1)" in r.stderr
    assert "[0] rank 0 starts at step 10" in r.stdout and "[1] rank 1 starts at step 10" in r.stdout
    final = [np.load(tmp_path / f"final-rank{rank}.npy") for rank in (0, 1)]
    assert np.array_equal(final[0], final[1])
    assert _rel(final[0], _custom_loop_weights()) <= 1e-5  # steps 11 and 12 ran again, from step 10
