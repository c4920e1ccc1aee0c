"""The training engine on real workers: collectives, Keras fit, data sharding, the example."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from helpers import ENGINES, PY, ROOT, WORKERS, check, clean_env, mldist, results, run_py

pytestmark = pytest.mark.slow
#: tests/runtime/conftest.py's shared launches: (engine, name) -> (output, folder).
Shared = Callable[[str, str], tuple[str, Path]]


def test_collectives_on_two_workers_wait_for_a_late_rank_without_spinning(engine: str, shared_engine: Shared) -> None:
    """Rank 1 reaches an all-reduce 3 s late: rank 0 waits there on a fraction of a core (a blocking
    MPI call busy-polled a whole one, taken from the rank it waited for on a shared node)."""
    out = shared_engine(engine, "patience")[0]
    (line,) = [line for line in out.splitlines() if line.startswith("[0] WAITED ")]
    cpu, wall = (float(v) for v in line.split()[2:])
    assert wall >= 2.5, line  # rank 0 did wait for rank 1
    assert cpu < 0.25 * wall, f"rank 0 used {cpu:.2f} CPU-s of a {wall:.2f} s wait: {line}"


def test_collectives_on_two_workers(engine: str, shared_engine: Shared) -> None:
    rows = results(shared_engine(engine, "collectives")[0])
    assert len(rows) == 2
    for row in rows:
        assert row["engine"] == engine
        assert row["sum_a"] == [3.0, 3.0, 3.0]  # 1 + 2
        assert row["sum_b"] == [[1]]  # int32 bucket: 0 + 1
        assert row["mean"] == [0.5]
        assert (row["max"], row["min"]) == ([1, 0], [0, -1])
        assert row["fp16"] == [2.0]  # mean of 1.5 and 2.5 sent as float16
        assert row["bcast"] == [[8.0], [True]]  # rank 1's values reach rank 0
        assert row["gather"] == [[0, 0], [1, 1], [1, 1]]  # 1 row from rank 0, 2 from rank 1
        assert row["kept"] == [2.0 * i + 1 for i in range(6)]  # i + 0 and i + 1, none overwritten
        r = row["rank"]
        assert row["untouched"] == [r + 1.0, r + 1.0, 2 * r + 2.0, 6.0]  # inputs keep their values
        for dtype, got in row["dtypes"].items():
            want = [[3.0] * 3, [6.0] * 2] + ([] if dtype == "complex64" else [[1.0, 7.0]])
            assert got == want, dtype  # sum of 1 and 2; rank 1's 6 everywhere; max of (0, 7) and (1, 6)
        # 3 float tensors + 1 int tensor: one collective per dtype, or per 80-byte bucket.
        assert (row["collectives_one_bucket"], row["collectives_small_buckets"]) == (2, 3)
        # 11 elements over 2 ranks (6 and 5), batch 2: both ranks run 2 steps.
        assert (row["steps"], row["file_steps"]) == (2, 2)


def test_collectives_on_two_workers_start_gradient_buckets_in_backprop_order(
    engine: str, shared_engine: Shared
) -> None:
    """Issue 49: a tape step's 40-byte buckets are all-reduced last layer first, one collective each, the
    first not reading the first layer's gradient (it starts while backprop goes on); the bits equal one
    bucket's; bf16 reaches the wire (1 + 2**-10 arrives as 1, fp16 keeps it)."""
    rows = results(shared_engine(engine, "overlap")[0])
    assert len(rows) == 2
    for row in rows:
        assert row["order"] == [10, 4, 12]  # bias 2 + kernel 4x2 (40 B), bias 4, kernel 3x4
        assert row["independent"] is True
        assert row["same_bits"] is True
        assert row["bf16"] == [2.0, 1.0, 1.0 + 2**-10]
        assert row["bf16_tape"] == [True] * 4  # within bfloat16's precision of float32, not equal to it
        # MPI moves the 16 bits (its own sum); TensorFlow's collectives sum no bfloat16: float32 there.
        assert row["wire"] == ["uint16" if engine == "mpi" else "float32"]


def test_one_worker_collectives_are_identities() -> None:
    res = check(run_py(str(WORKERS / "collectives.py")))
    (row,) = results(res.stdout)
    assert (row["sum_a"], row["mean"], row["gather"]) == ([1.0, 1.0, 1.0], [0.0], [[0, 0]])
    assert row["kept"] == [float(i) for i in range(6)]
    assert row["untouched"] == [1.0, 1.0, 2.0, 2.0]
    assert row["dtypes"]["bfloat16"] == [[1.0] * 3, [5.0] * 2, [0.0, 7.0]]
    assert (row["collectives_one_bucket"], row["collectives_small_buckets"]) == (0, 0)
    assert (row["steps"], row["file_steps"]) == (5, 5)


def _fit(mode: str, out: Path, workers: int, engine: str = "auto") -> subprocess.CompletedProcess[str]:
    args = [str(WORKERS / "fit_modes.py"), mode, str(out)]
    if workers == 1:
        return run_py(*args, timeout=240)
    return mldist(["run", "-n", str(workers), "--communication", engine, "--", PY, *args], timeout=240)


def test_two_workers_match_one_process_on_the_whole_batch(
    engine: str, shared_engine: Shared, one_process_fit: Callable[[str], Path]
) -> None:
    two = shared_engine(engine, "equivalence")[1]
    w0, w1 = (np.load(two / f"weights-{r}.npy") for r in (0, 1))
    ref = np.load(one_process_fit("tensorflow") / "weights-0.npy")
    assert np.array_equal(w0, w1)  # bit-identical although the ranks were seeded differently
    assert np.linalg.norm(w0 - ref) / np.linalg.norm(ref) < 1e-5


def test_applied_gradient_is_the_mean_of_the_workers_gradients(engine: str, shared_engine: Shared) -> None:
    out = shared_engine(engine, "meangrad")[1]
    g0, g1 = (np.load(out / f"grad-{r}.npy") for r in (0, 1))
    assert not np.allclose(g0, g1)  # the workers really had different data
    for r in (0, 1):
        after = np.load(out / f"after-{r}.npy")
        np.testing.assert_allclose(after, 1.0 - (g0 + g1) / 2, rtol=1e-6)  # w0 = 1, lr = 1


UNEVEN = ("uneven", "UNEVEN-FIT-RAN", "steps per epoch differ between workers (rank 0: 3, rank 1: 4)")
SHAPES = ("shapes", "SHAPES-RAN", "workers passed tensors of different shapes")


# The XLA check runs before any collective, the same on every engine: one engine is enough for it.
@pytest.mark.parametrize(
    "mode, ran, message, engine",
    [
        pytest.param("xla", "XLA-FIT-RAN", "jit_compile=False", "mpi", id="xla-on-cpu-mpi"),
        *[pytest.param(*UNEVEN, e, id=f"uneven-steps-naming-each-rank-{e}") for e in ENGINES],
        *[pytest.param(*SHAPES, e, id=f"shape-mismatch-in-a-collective-{e}") for e in ENGINES],
    ],
)
def test_worker_mistakes_stop_before_training_with_a_clear_message(
    mode: str, ran: str, message: str, tmp_path: Path, engine: str
) -> None:
    """XLA on CPU, uneven steps per epoch, different shapes in one collective: exit 1, said plainly."""
    res = check(_fit(mode, tmp_path, 2, engine), 1)
    both = res.stdout + res.stderr
    assert ran not in res.stdout
    assert message in both
    if mode == "xla":  # one clear line: every error line names the fix
        lines = [line for line in both.splitlines() if "mldist: error" in line]
        assert lines and all(message in line for line in lines)
    assert "Traceback" not in both


def test_example_reaches_95_percent_with_two_workers(digits_run: Path) -> None:
    """The README's main job (tests/conftest.py runs it once for this test and the run-directory tests)."""
    _reaches_95_percent(digits_run, (digits_run.parent / "console.txt").read_text())
    assert "shuffle=True" not in (digits_run.parent / "stderr.txt").read_text()


def test_example_reaches_95_percent_with_two_workers_on_jax(tmp_path: Path) -> None:
    example = ROOT / "examples" / "digits_cnn.py"
    env = clean_env(KERAS_BACKEND="jax")
    # 12 of the default 20 epochs (seeded: test accuracy 0.961 here; 8 epochs give 0.953).
    argv = ["run", "-n", "2", "--", PY, str(example), "--out", str(tmp_path), "--epochs", "12"]
    res = check(mldist(argv, env=env, timeout=300))
    _reaches_95_percent(tmp_path, res.stdout)
    assert "shuffle=True" not in res.stderr


def _reaches_95_percent(out: Path, stdout: str) -> None:
    r0, r1 = (json.loads((out / f"result-rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["size"], r1["rank"]) == (2, 1)
    assert r0["test_accuracy"] >= 0.95
    assert r0["weights_sha256"] == r1["weights_sha256"]
    # Progress is printed by rank 0 only, without Keras's warning about an ignored shuffle=True.
    assert "[0] Epoch 1/" in stdout and "[1] Epoch" not in stdout
    assert "shuffle=True" not in stdout


def test_legacy_tf_keras_scope_fit_and_distributed_optimizer(engine: str) -> None:
    worker = [PY, str(WORKERS / "legacy.py")]
    env = clean_env(TF_USE_LEGACY_KERAS="1")
    res = check(mldist(["run", "-n", "2", "--communication", engine, "--", *worker], env=env, timeout=240))
    r0, r1 = results(res.stdout)
    assert r0["keras"].startswith("tf_keras") and r0["optimizer_class"].startswith("tf_keras")
    assert r0["scope"] == r1["scope"]  # MultiWorkerMirroredStrategy scope + fit
    assert r0["optimizer"] == r1["optimizer"]  # DistributedOptimizer outside any scope
    assert r0["plain"] != r1["plain"]  # the control: different data, no averaging
