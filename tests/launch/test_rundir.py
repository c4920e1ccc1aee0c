"""The run directory of ``mldist run``: its pure parts, and real runs of workers without TensorFlow."""

from __future__ import annotations

import datetime
import io
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from helpers import PY, check, clean_env, mldist
from mldist.base.rundir import default_run_dir, run_dir_name, run_name
from mldist.launch.groups import pump
from mldist.launch.local import RunConfig, worker_env
from mldist.launch.rundir import config_record, merge_reports, shell_code, status_of

# A worker that prints on both streams and reports like mldist.keras.RunLog does.
REPORTER = (
    "import json, os, sys; r = os.environ['MLDIST_RANK']; d = os.environ['MLDIST_RUN_DIR']; "
    "print('out of', r); print('err of', r, file=sys.stderr); "
    "json.dump({'samples_per_second': 100.0 + int(r), 'step_seconds': 0.5, 'epochs': 3, "
    "'metrics': {'loss': 0.25}}, open(os.path.join(d, f'rank-{r}.metrics.json'), 'w'))"
)


def _json(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "command, name",
    [
        (["python", "examples/digits_cnn.py", "--epochs", "2"], "digits_cnn"),
        (["/v/bin/python3", "-u", "-m", "pkg.train_it"], "train_it"),
        (["bash", "-c", "echo hi"], "bash"),
        (["./my job.sh"], "my_job"),
        ([], "run"),
        # issue 47: a module that runs a script is passed over; the script names the run.
        (["python", "-m", "mldist.horovod.alias", "hvd/script.py", "--epochs", "2"], "script"),
        (["python", "-m", "mldist.horovod.alias", "./train", "-v"], "train"),
        (["python", "-m", "mldist.horovod.alias", "-m", "pytest", "test_tf.py"], "pytest"),
        (["python", "-m", "cProfile", "-o", "prof.out", "train.py"], "train"),
        (["python", "-m", "trace", "--count", "train"], "train"),
        (["python", "-m", "mldist.horovod.alias"], "alias"),
    ],
)
def test_run_name_is_the_script_stem(command: list[str], name: str) -> None:
    assert run_name(command) == name


def test_default_run_dir_is_runs_name_time_and_never_an_existing_one(tmp_path: Path) -> None:
    when = datetime.datetime(2026, 11, 24, 1, 2, 3)
    assert run_dir_name(["python", "train.py"], when) == "train-20261124-010203"
    first = default_run_dir(["python", "train.py"], tmp_path)
    assert first.parent == tmp_path and first.name.startswith("train-")
    first.mkdir()
    second = default_run_dir(["python", "train.py"], tmp_path)
    assert second != first and second.name.startswith(first.name)


def test_merge_needs_every_rank_for_the_total_and_keeps_each() -> None:
    reports = {0: {"samples_per_second": 10.0, "step_seconds": 0.1, "metrics": {"loss": 1.0}, "epochs": 2}}
    merged = merge_reports(reports, 2)
    assert merged["samples_per_second"] is None
    assert merged["samples_per_second_per_worker"] == [10.0, None]
    assert merged["step_seconds_per_rank"] == [0.1, None]
    assert merged["final_metrics"] == {"loss": 1.0} and merged["epochs"] == 2
    assert merge_reports({}, 1)["final_metrics"] == {}
    bad = merge_reports({0: {"samples_per_second": "fast", "metrics": [1]}}, 1)
    assert bad["samples_per_second"] is None and bad["final_metrics"] == {}


def test_status_and_exit_codes() -> None:
    assert [status_of(c, []) for c in (0, 75, 3, None)] == ["ok", "requeue", "failed", "launcher-error"]
    assert status_of(130, [2]) == "stopped" and status_of(1, [10]) == "failed"  # SIGUSR1 stops nothing
    assert [shell_code(c) for c in (0, 3, -15, None)] == [0, 3, 143, None]


def test_config_record_says_what_runs_and_imports_no_tensorflow() -> None:
    rec = config_record(RunConfig(2, ("python", "t.py"), communication="ring"), "direct", {})
    assert rec["ranks"] == 2 and rec["engine_requested"] == "ring" and rec["command"] == ["python", "t.py"]
    assert set(rec["threads"]) == {"cpus", "intra_op", "inter_op", "source", "overrides", "note"}
    assert {"python", "mldist"} <= set(rec["versions"]) and rec["host"] and rec["started"]
    code = "import sys; from mldist.launch import rundir; rundir.versions(); assert 'tensorflow' not in sys.modules"
    check(subprocess.run([PY, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60))


def test_workers_learn_the_run_dir_and_never_inherit_an_outer_one(tmp_path: Path) -> None:
    workers = ("127.0.0.1:1", "127.0.0.1:2")
    env = worker_env({"MLDIST_RUN_DIR": "/outer"}, RunConfig(2, ("true",), run_dir="rel"), 0, workers, "r")
    assert env["MLDIST_RUN_DIR"] == os.path.abspath("rel")
    assert "MLDIST_RUN_DIR" not in worker_env({"MLDIST_RUN_DIR": "/outer"}, RunConfig(2, ("true",)), 0, workers, "r")


def test_pump_tees_unprefixed_lines() -> None:
    out, tee = io.BytesIO(), io.BytesIO()
    pump(lambda: io.BytesIO(b"one\ntwo"), b"[3] ", out, threading.Lock(), True, tee)
    assert out.getvalue() == b"[3] one\n[3] two\n" and tee.getvalue() == b"one\ntwo\n"


def test_a_run_leaves_config_logs_and_a_merged_summary(tmp_path: Path, engine: str) -> None:
    run_dir = tmp_path / "r"
    res = check(
        mldist(["run", "-n", "2", "--communication", engine, "--run-dir", str(run_dir), "--", PY, "-c", REPORTER])
    )
    assert "[1] out of 1" in res.stdout and f"run directory {run_dir}" in res.stderr
    config = _json(run_dir / "config.json")
    assert config["ranks"] == 2 and config["command"][0] == PY and config["run_dir"] == str(run_dir.resolve())
    assert config["launcher"]["workers_started_by"] == ("mpiexec" if engine == "mpi" else "direct")
    for r in (0, 1):
        assert sorted((run_dir / f"rank-{r}.log").read_text().splitlines()) == [f"err of {r}", f"out of {r}"]
    summary = _json(run_dir / "summary.json")
    assert summary["status"] == "ok" and summary["exit_code"] == 0 and summary["exit_codes"] == [0, 0]
    assert summary["restarts"] == 0 and summary["wall_seconds"] > 0
    assert summary["samples_per_second"] == 201.0 and summary["samples_per_second_per_worker"] == [100.0, 101.0]
    assert summary["step_seconds_per_rank"] == [0.5, 0.5] and summary["final_metrics"] == {"loss": 0.25}


#: Rank 0 exits 0; rank 1 exits 3 only after rank 0 is gone (else, on a busy machine, rank 1 may
#: fail first and the launcher stops rank 0 with SIGTERM: 143).
FAIL_AFTER_RANK_0 = """
import os, pathlib, sys, time
flag = pathlib.Path(sys.argv[1]) / "rank0-done"
if os.environ["MLDIST_RANK"] == "0":
    flag.touch()
    sys.exit(0)
deadline = time.monotonic() + 60
while not flag.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1)
sys.exit(3)
"""


def test_a_failed_run_says_so_and_counts_restarts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["run", "-n", "2", "--communication", "ring", "--max-restarts", "1", "--run-dir", str(run_dir)]
    check(mldist([*args, "--", PY, "-c", FAIL_AFTER_RANK_0, str(tmp_path)]), 3)
    summary = _json(run_dir / "summary.json")
    assert summary["status"] == "failed" and summary["exit_code"] == 3 and summary["restarts"] == 1
    assert summary["exit_codes"] == [0, 3] and summary["samples_per_second"] is None


def test_default_run_dir_is_under_runs_and_no_run_dir_writes_none(tmp_path: Path) -> None:
    without_override = {k: v for k, v in clean_env().items() if k != "MLDIST_RUNS_DIR"}
    check(mldist(["run", "-n", "1", "--", PY, "-c", "print('x')"], cwd=tmp_path, env=without_override))
    (made,) = (tmp_path / "runs").iterdir()
    assert made.name.startswith("python-") and (made / "summary.json").is_file()
    bare = tmp_path / "bare"
    bare.mkdir()
    code = "import os; assert 'MLDIST_RUN_DIR' not in os.environ"
    check(
        mldist(["run", "-n", "1", "--no-run-dir", "--", PY, "-c", code], cwd=bare, env=clean_env(MLDIST_RUN_DIR="/x"))
    )
    assert list(bare.iterdir()) == []


def test_mldist_runs_dir_moves_the_default_run_directories(tmp_path: Path) -> None:
    check(mldist(["run", "-n", "1", "--", PY, "-c", "print('x')"], env=clean_env(MLDIST_RUNS_DIR=str(tmp_path))))
    (made,) = tmp_path.iterdir()
    assert made.name.startswith("python-") and (made / "config.json").is_file()


def test_a_run_through_the_horovod_alias_is_named_for_its_script(tmp_path: Path) -> None:
    """issue 47: ``-m mldist.horovod.alias script.py`` made ``runs/alias-<time>``."""
    script = tmp_path / "script.py"
    script.write_text("import horovod  # through the alias\nprint('ran')\n")
    runs = tmp_path / "runs"
    argv = ["run", "-n", "1", "--", PY, "-m", "mldist.horovod.alias", str(script)]
    assert "ran" in check(mldist(argv, env=clean_env(MLDIST_RUNS_DIR=str(runs)))).stdout
    (made,) = runs.iterdir()
    assert made.name.startswith("script-") and (made / "summary.json").is_file()


def test_log_dir_keeps_its_meaning_and_the_run_dir_links_to_it(tmp_path: Path) -> None:
    logs, run_dir = tmp_path / "logs", tmp_path / "run"
    check(mldist(["run", "-n", "2", "--log-dir", str(logs), "--run-dir", str(run_dir), "--", "bash", "-c", "echo hi"]))
    assert (logs / "rank-1.log").read_text() == "hi\n"
    assert (run_dir / "rank-1.log").is_symlink() and (run_dir / "rank-1.log").read_text() == "hi\n"


def test_a_run_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    res = mldist(["run", "-n", "1", "--run-dir", str(tmp_path / "f"), "--", "true"])
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "is a file" in res.stderr
