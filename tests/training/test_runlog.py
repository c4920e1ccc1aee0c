"""mldist.keras.RunLog and ``mldist tensorboard``: pure parts, then real runs (slow: TensorFlow workers)."""

from __future__ import annotations

import csv
import json
import os
import pwd
import queue
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import PY, ROOT, check, clean_env, mldist, processes_with, results, tail
from mldist.errors import ConfigError
from mldist.keras.epochs import append_row, epoch_row, plot_png, read_rows
from mldist.keras.runlog import RunLog, resolve_run_dir, speed
from mldist.launch.config import RunConfig
from mldist.launch.procs import run_env
from mldist.tools.tensorboard import logdir_spec, login_host, ssh_line, ssh_user

PNG = b"\x89PNG\r\n\x1a\n"
# Plain python (no launcher): a tiny model with validation data, default callbacks, then RunLog(None),
# then a RunLog that may redraw its plot only once an hour: drawn when fit ends, not after each epoch;
# then one under MLDIST_PLOT=0: its table, no plot.
PLAIN = """
import os, keras, numpy as np, mldist, mldist.keras
mldist.init()
x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32"); y = (x[:, 0] > 0).astype("int64")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=3, validation_split=0.25, verbose=0, callbacks=mldist.keras.default_callbacks())
model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[mldist.keras.RunLog(None)])
class Probe(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print("plot after epoch", epoch, os.path.exists("hourly/metrics.png"))
model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[mldist.keras.RunLog("hourly", plot_every=3600), Probe()])
print("plot after fit", os.path.exists("hourly/metrics.png"))
os.environ["MLDIST_PLOT"] = "0"  # as a job script would set it
model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[mldist.keras.RunLog("quiet")])
print("MLDIST_PLOT=0:", os.path.exists("quiet/metrics.csv"), os.path.exists("quiet/metrics.png"))
"""
# Under mldist run --no-run-dir: a fit with the default callbacks, then where RunLog wrote and the averaged loss.
NO_RUN_DIR = """
import json, keras, numpy as np, mldist, mldist.keras
ctx = mldist.init()
x = np.random.default_rng(ctx.rank).normal(size=(64, 4)).astype("float32"); y = (x[:, 0] > 0).astype("int64")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
callbacks = mldist.keras.default_callbacks()
loss = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=callbacks).history["loss"][-1]
(log,) = [c for c in callbacks if isinstance(c, mldist.keras.RunLog)]
print("RESULT", json.dumps({"rank": ctx.rank, "path": str(log.path), "loss": round(loss, 6)}), flush=True)
"""


def test_where_runlog_writes() -> None:
    assert resolve_run_dir("auto", 3, {"MLDIST_RUN_DIR": "/r/a"}, ["t.py"]) == Path("/r/a")
    assert resolve_run_dir("auto", 1, {}, ["t.py"]) is None  # plain launchers: rank 0 only
    made = resolve_run_dir("auto", 0, {}, ["/x/train.py"])
    assert made is not None and made.parent == Path("runs") and made.name.startswith("train-")
    assert resolve_run_dir("mine", 5, {"MLDIST_RUN_DIR": "/r/a"}, []) == Path("mine")
    assert resolve_run_dir(None, 0, {"MLDIST_RUN_DIR": "/r/a"}, []) is None


def test_no_run_dir_tells_the_workers_and_runlog_then_writes_nowhere() -> None:
    """mldist run --no-run-dir: RunLog() on rank 0 made a runs/<script>-<time> of its own all the same."""
    told = run_env(RunConfig(2, ("python", "t.py"), run_dir=None), "r1", 0)
    assert resolve_run_dir("auto", 0, told, ["t.py"]) is None and resolve_run_dir("auto", 1, told, ["t.py"]) is None
    assert resolve_run_dir("mine", 0, told, ["t.py"]) == Path("mine")  # the script's own directory stands
    given = run_env(RunConfig(2, ("python", "t.py"), run_dir="/r/x"), "r1", 0)
    assert resolve_run_dir("auto", 0, given, ["t.py"]) == Path("/r/x")


@pytest.mark.parametrize("bad", ["60", -1, float("nan"), True])
def test_plot_every_must_be_seconds(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"plot_every=.*: use a number of seconds >= 0"):
        RunLog(plot_every=bad)  # type: ignore[arg-type]


def test_mldist_plot_sets_the_default_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLDIST_PLOT", "0")
    assert RunLog().plot is False and RunLog(plot=True).plot is True
    monkeypatch.delenv("MLDIST_PLOT")
    assert RunLog().plot is True
    monkeypatch.setenv("MLDIST_PLOT", "no")  # a yes/no like every MLDIST_* one
    assert RunLog().plot is False
    monkeypatch.setenv("MLDIST_PLOT", "maybe")
    with pytest.raises(ConfigError, match=r"MLDIST_PLOT='maybe' is not yes or no: set it to 1, yes or true"):
        RunLog()


def test_rows_and_speed() -> None:
    row = epoch_row(1, {"val_accuracy": 0.5, "accuracy": 0.6, "val_loss": 1.0, "loss": 0.9, "flag": True}, {"x": None})
    assert list(row) == ["epoch", "loss", "accuracy", "val_loss", "val_accuracy"] and row["epoch"] == 2
    assert speed(0, 1.0, 32)["samples_per_second"] is None
    assert speed(4, 2.0, None) == {"step_seconds": 0.5, "steps_per_second": 2.0, "samples_per_second": None}


def test_the_table_keeps_its_first_header_and_damaged_lines_are_skipped(tmp_path: Path) -> None:
    append_row(tmp_path, {"epoch": 1, "loss": 0.5, "val_loss": 0.7})
    append_row(tmp_path, {"epoch": 2, "loss": 0.4})
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert rows == [{"epoch": "1", "loss": "0.5", "val_loss": "0.7"}, {"epoch": "2", "loss": "0.4", "val_loss": ""}]
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"epoch": 3, "lo')  # a crash mid-line
    assert [r["epoch"] for r in read_rows(tmp_path)] == [1, 2]


def test_the_plot_is_a_png_with_train_and_validation() -> None:
    rows = [{"epoch": e, "loss": 1 / e, "val_loss": 1.2 / e, "accuracy": 1 - 1 / (e + 1)} for e in (1, 2, 3)]
    image = plot_png(rows, "test")
    assert image.startswith(PNG) and len(image) > 5000
    assert plot_png([], "empty").startswith(PNG)  # no epoch yet: an empty figure, no error


def test_ssh_line_and_logdir_spec() -> None:
    assert ssh_line("ana", "login1.x.org", "login1", 6006, 7000) == "ssh -L 6006:localhost:7000 ana@login1.x.org"
    assert ssh_line("ana", "login1", "node7", 8000, 7000) == "ssh -L 8000:localhost:7000 -J ana@login1 ana@node7"
    assert login_host({"PBS_O_HOST": "pbs-login"}) == "pbs-login" and login_host({}, "me.org") == "me.org"
    assert logdir_spec(["a/run", "b/run"]) == "run:a/run,run-2:b/run"
    assert ssh_user({"USER": "ana", "LOGNAME": "x"}) == "ana" and ssh_user({"LOGNAME": "bo"}) == "bo"
    assert ssh_user({}) == pwd.getpwuid(os.getuid()).pw_name != "you"  # no $USER in the job: the account's name


@pytest.mark.slow
def test_the_example_writes_its_results_into_the_run_directory_and_names_it_last(digits_run: Path) -> None:
    base = digits_run.parent
    assert sorted(p.name for p in base.iterdir()) == ["console.txt", "run", "stderr.txt"]  # no second results folder
    assert [json.loads((digits_run / f"result-rank{r}.json").read_text())["rank"] for r in (0, 1)] == [0, 1]
    last = (base / "console.txt").read_text().splitlines()[-1]
    assert last.startswith("[0] 2 worker(s): test accuracy") and last.endswith(f"results in {digits_run}/")


@pytest.mark.slow
def test_a_training_run_leaves_metrics_plot_events_and_summary(digits_run: Path) -> None:
    d = digits_run
    assert json.loads((d / "config.json").read_text())["ranks"] == 2
    assert "rank 0 of 2" in (d / "rank-0.log").read_text() and "rank 1 of 2" in (d / "rank-1.log").read_text()
    rows = list(csv.DictReader((d / "metrics.csv").open()))
    assert [r["epoch"] for r in rows] == [str(e) for e in range(1, 21)] and float(rows[-1]["samples_per_second"]) > 0
    assert [json.loads(line)["epoch"] for line in (d / "metrics.jsonl").read_text().splitlines()] == list(range(1, 21))
    image = (d / "metrics.png").read_bytes()
    assert image.startswith(PNG) and len(image) > 5000
    assert list(d.glob("tensorboard/**/events.out.tfevents.*"))
    summary = json.loads((d / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["exit_codes"] == [0, 0] and summary["status"] == "ok"
    assert summary["samples_per_second"] > 0 and all(s > 0 for s in summary["samples_per_second_per_worker"])
    assert all(t > 0 for t in summary["step_seconds_per_rank"]) and "accuracy" in summary["final_metrics"]
    # What `mldist status` reads: rank 0's progress, finished, with 2 workers' rate and the last metrics.
    progress = json.loads((d / "training.json").read_text())
    assert (progress["epoch"], progress["epochs"], progress["done"]) == (20, 20, True), progress
    assert progress["step"] == progress["steps"] > 0 and progress["samples_per_second"] > 0, progress
    assert {"loss", "accuracy"} <= set(progress["metrics"]) and progress["epoch_seconds"] > 0, progress


@pytest.mark.slow
def test_mldist_status_shows_how_the_run_ended_and_its_progress(digits_run: Path) -> None:
    """``mldist status RUN_DIR`` on the README's run: it took job ids only and refused a run directory."""
    res = check(mldist(["status", str(digits_run)]))
    (line,) = res.stdout.splitlines()
    assert line.startswith(f"{digits_run}  OK  exit 0  ended "), line
    assert re.search(r" ago\)  epoch 20/20 step (\d+)/\1, [0-9,]+ samples/s, loss \S+ .*, finished$", line), line


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [out.put(line) for line in stdout], daemon=True).start()
    return out


@pytest.mark.slow
def test_tensorboard_answers_on_loopback_and_prints_the_ssh_line(digits_run: Path) -> None:
    t0 = time.monotonic()
    argv = [PY, "-m", "mldist", "tensorboard", str(digits_run), "--login-host", "login.example.org"]
    env = {k: v for k, v in clean_env().items() if k not in ("USER", "LOGNAME")}  # as in some batch jobs
    me = re.escape(pwd.getpwuid(os.getuid()).pw_name)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = _lines(proc)
        said = [lines.get(timeout=30) for _ in range(3)]
        port = int(re.search(r"http://127\.0\.0\.1:([0-9]+)/", said[0]).group(1))  # type: ignore[union-attr]
        assert re.fullmatch(rf"ssh -L {port}:localhost:{port} (-J {me}@login\.example\.org )?{me}@\S+", said[1].strip())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=10) as resp:
            assert any("tensorboard/train" in run for run in json.loads(resp.read()))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert time.monotonic() - t0 < 60  # no hang: TensorBoard starts in seconds, slower on a loaded machine
    assert processes_with(str(digits_run)) == []  # TensorBoard went with it


@pytest.mark.slow
def test_plain_python_gets_a_default_run_dir_with_validation_curves(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(PLAIN)
    env = {k: v for k, v in clean_env(MLDIST_PLOT="1").items() if k != "MLDIST_RUNS_DIR"}  # the default: ./runs
    res = subprocess.run([PY, "tiny.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, tail(res)
    (made,) = (tmp_path / "runs").iterdir()
    assert made.name.startswith("tiny-") and f"in runs/{made.name}" in res.stdout
    rows = list(csv.DictReader((made / "metrics.csv").open()))
    assert len(rows) == 3 and rows[0]["val_loss"] and rows[0]["val_accuracy"]  # RunLog(None) added no row
    assert json.loads((made / "rank-0.metrics.json").read_text())["batch_size"] == 32
    assert (made / "metrics.png").read_bytes().startswith(PNG) and list(made.glob("tensorboard/validation/*"))
    probed = [line for line in res.stdout.splitlines() if line.startswith("plot after")]
    assert probed == ["plot after epoch 0 False", "plot after epoch 1 False", "plot after fit True"], res.stdout
    assert len(list(csv.DictReader((tmp_path / "hourly" / "metrics.csv").open()))) == 2
    assert "MLDIST_PLOT=0: True False" in res.stdout, res.stdout


@pytest.mark.slow
def test_the_example_without_mldist_run_writes_one_run_directory(tmp_path: Path) -> None:
    """python examples/digits_cnn.py: results, metrics and progress in RunLog's runs/digits_cnn-<time>/ alone."""
    env = {k: v for k, v in clean_env(MLDIST_PLOT="0").items() if k != "MLDIST_RUNS_DIR"}
    argv = [PY, str(ROOT / "examples" / "digits_cnn.py"), "--epochs", "1"]
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, tail(res)
    (made,) = (tmp_path / "runs").iterdir()
    assert made.name.startswith("digits_cnn-") and {"result-rank0.json", "metrics.csv", "training.json"} <= {
        p.name for p in made.iterdir()
    }
    assert res.stdout.rstrip().endswith(f"results in {made}/"), res.stdout[-500:]


@pytest.mark.slow
def test_no_run_dir_leaves_no_directory_and_the_other_callbacks_still_work(tmp_path: Path) -> None:
    """``mldist run --no-run-dir`` with ``default_callbacks()``: RunLog made ``runs/<script>-<time>`` on rank 0."""
    script = tmp_path / "tiny.py"
    script.write_text(NO_RUN_DIR)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in clean_env().items() if k != "MLDIST_RUNS_DIR"}  # the default: ./runs
    res = check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, str(script)], cwd=cwd, env=env, timeout=300))
    assert list(cwd.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "tiny.py"], res.stdout
    rows = results(res.stdout)
    assert [r["path"] for r in rows] == ["None", "None"], res.stdout
    assert rows[0]["loss"] == rows[1]["loss"], rows  # AverageMetrics still averaged the two ranks' losses
    assert "RunLog" not in res.stdout + res.stderr, tail(res)


def test_tensorboard_refuses_a_missing_run_dir(tmp_path: Path) -> None:
    res = mldist(["tensorboard", str(tmp_path / "nope")])
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "is not a directory" in res.stderr
