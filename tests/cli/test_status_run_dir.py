"""``mldist status RUN_DIR``: the state of a run directory of ``mldist run``, beside the job form.

docs/guides/hangs.md said the slow-rank line "goes to straggler.json in the run directory, which
``mldist status`` shows", but ``mldist status`` took job ids only and refused a run directory. The
run directories here are written by the project's own writers (``mldist.launch.rundir.Record`` for
config.json and summary.json, RunLog's ``training.record`` for training.json, rank 0's
``straggler_watch.Tracker`` for straggler.json); a real run's is tests/training/test_runlog.py's.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import PY
from mldist.base import training
from mldist.base.rundir import write_json
from mldist.cli import build_parser, main
from mldist.launch.config import RunConfig
from mldist.launch.rundir import Record
from mldist.runtime.watch import straggler_watch
from mldist.runtime.watch.straggler import Finding

#: A moment of a fit: epoch 2 of 4, step 5 of 10, as RunLog on rank 0 writes it.
PROGRESS = {"epoch": 2, "epochs": 4, "step": 5, "steps": 10, "step_seconds": 0.5, "samples_per_second": 256.0,
            "metrics": {"loss": 0.25}, "epoch_seconds": 5.0}  # fmt: skip
SLOW = Finding(1, "node7", (1,), False, 0.96, 0.18, 0.31, "step", "data.py:42 next_batch")


def _run_dir(where: Path, done: bool = False, slow: bool = False) -> Record:
    """A run directory as ``mldist run -n 2`` leaves it while it runs (this process as its launcher)."""
    record = Record(RunConfig(2, ("python", "train.py"), run_dir=str(where)), "direct", {})
    write_json(where / training.FILE, training.record(**PROGRESS, done=done))  # type: ignore[arg-type]
    if slow:
        tracker = straggler_watch.Tracker(2, 10, 30, run_dir=where, plot=False)
        tracker.say(SLOW, time.time())
    return record


def _status(target: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()  # what the writers said
    code = main(["status", target])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_running_run_shows_its_progress_and_the_slow_rank_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "train-20261124-010203"
    _run_dir(run_dir, slow=True)
    code, out, err = _status(str(run_dir), capsys)
    assert (code, err) == (0, ""), err
    (line,) = out.splitlines()
    assert line.startswith(f"{run_dir}  RUNNING  started "), line
    assert "epoch 2/4 step 5/10, 256 samples/s, loss 0.25, 5.0 s/epoch, " in line and " left (written " in line
    slow = straggler_watch.status(run_dir)  # the line rank 0 kept, as the job form shows it
    assert slow.startswith("; slow: rank 1 (node7) arrives last at 96 % of collectives") and line.endswith(slow)


def test_a_failed_run_says_how_and_when_it_ended_and_which_rank_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    record = _run_dir(run_dir)
    record.end(3, [SimpleNamespace(poll=lambda: 143), SimpleNamespace(poll=lambda: 3)], restarts=0, signals=[])  # type: ignore[list-item]
    code, out, err = _status(str(run_dir), capsys)
    assert (code, err) == (0, ""), err
    (line,) = out.splitlines()
    assert re.fullmatch(
        rf"{re.escape(str(run_dir))}  FAILED  exit 3 \(rank 1 exit 3\)  ended \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\S* "
        r"\(\d+\.\d s ago\)  epoch 2/4 step 5/10, 256 samples/s, loss 0\.25, 5\.0 s/epoch, stopped there \(\S+\)",
        line,
    ), line


def test_a_run_that_ended_ok_shows_its_final_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    _run_dir(run_dir, done=True).end(0, [SimpleNamespace(poll=lambda: 0)] * 2, restarts=1, signals=[])  # type: ignore[list-item]
    code, out, _ = _status(str(run_dir), capsys)
    (line,) = out.splitlines()
    assert code == 0 and line.startswith(f"{run_dir}  OK  exit 0 restarts 1  ended "), line
    assert line.endswith("loss 0.25, 5.0 s/epoch, finished"), line


def test_a_run_whose_launcher_is_gone_without_a_summary_is_not_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A launcher killed hard leaves no summary.json: its run is not shown as running."""
    run_dir = tmp_path / "run"
    _run_dir(run_dir)
    gone = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    config = (run_dir / "config.json").read_text()
    (run_dir / "config.json").write_text(re.sub(r'"pid": \d+', f'"pid": {gone.stdout.strip()}', config))
    _, out, _ = _status(str(run_dir), capsys)
    (line,) = out.splitlines()
    assert line.startswith(f"{run_dir}  GONE  its launcher (pid {gone.stdout.strip()}) is gone and left no "), line
    assert "stopped there" in line and "RUNNING" not in line


def test_a_folder_that_is_no_run_directory_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_dir(tmp_path / "runs" / "train-20261124-010203")
    code, out, err = _status(str(tmp_path / "runs"), capsys)
    assert (code, out) == (2, "") and len(err.splitlines()) == 1, err
    assert err.startswith(f"mldist status: error: {tmp_path / 'runs'} is not a run directory"), err
    assert err.endswith(
        f"; it holds 1 run directory, e.g. mldist status {tmp_path / 'runs' / 'train-20261124-010203'}\n"
    )
    (tmp_path / "a-file").write_text("x\n")
    code, _, err = _status(str(tmp_path / "a-file"), capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "is a file, not a run directory" in err, err


@pytest.mark.parametrize("target", ["runs/no-such-run", "42 42", ""])
def test_neither_a_job_id_nor_a_directory_names_both(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["status", target])
    (line,) = capsys.readouterr().err.splitlines()
    assert ended.value.code == 2 and f"{target!r} is neither a job id (e.g. 4242" in line, line
    assert "nor an existing run directory (e.g. runs/train-20261124-010203)" in line, line


def test_the_help_names_both_forms() -> None:
    status = build_parser()[0].commands["status"]
    text = status.format_help()
    assert "JOB|RUN_DIR" in text and "mldist status runs/" in text, text
