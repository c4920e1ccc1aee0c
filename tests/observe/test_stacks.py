"""``mldist stacks`` on a run that is over: when and how it ended, and its last records as history.

issue 47 (21) and issue 50 (4): on a run that had failed minutes before, stacks showed every rank
"in collective #4 ... for 453 s", blamed Python's lock (the GIL) and exited 0. The runs here are
real ``mldist run`` launches of tests/workers/ended.py, which writes its records through the
collective watch's own code, without TensorFlow.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import PY, WORKERS, clean_env, mldist
from mldist.base import nodes, progress
from mldist.cli import main
from mldist.runtime.watch import stall

ENDED = str(WORKERS / "ended.py")


def _finished_run(tmp_path: Path, *args: str) -> tuple[Path, dict[str, object]]:
    """A run directory of a 2-rank run of ended.py ARGS that is over, and its summary."""
    run_dir = tmp_path / "run"
    res = mldist(["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, ENDED, *args], timeout=60)
    assert res.stdout.count("PUBLISHED") == 2, res.stdout + res.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    return run_dir, summary


def test_stacks_of_a_failed_run_says_when_and_how_it_ended_and_shows_the_last_records_as_history(
    tmp_path: Path,
) -> None:
    run_dir, summary = _finished_run(tmp_path, "5", "1")  # records 5 s old when it ends: stale
    assert summary["status"] == "failed"
    assert all(r.stale() for r in progress.read(run_dir / "progress").values())  # what drew the GIL blame
    res = mldist(["stacks", str(run_dir)], timeout=30)
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.splitlines()
    ended = datetime.datetime.fromisoformat(str(summary["ended"])).isoformat(sep=" ")
    assert line.startswith(f"mldist stacks: {run_dir}: this run ended at {ended} ("), line
    assert line.endswith(" ago), failed (exit code 1); below are its ranks' last records, as they were then, "
                         "not where anything is now"), line  # fmt: skip
    for rank in (0, 1):
        (head,) = [h for h in res.stdout.splitlines() if h.startswith(f"rank {rank} (")]
        pattern = (rf"rank {rank} \(\S+, pid \d+\), last record at \d\d:\d\d:\d\d \(\d s before the run ended\): "
                   r"it was in collective #4 allreduce\(sum\), for 0 s")  # fmt: skip
        assert re.fullmatch(pattern, head), head
    assert res.stdout.count("ended.py:") == 2 and "time.sleep(" in res.stdout
    assert "GIL" not in res.stdout + res.stderr and "lock" not in res.stdout + res.stderr


def test_stacks_of_a_run_that_ended_ok_exits_0_and_still_says_it_is_over(tmp_path: Path) -> None:
    run_dir, summary = _finished_run(tmp_path, "0")
    res = mldist(["stacks", str(run_dir)], timeout=30)
    assert (res.returncode, summary["status"]) == (0, "ok"), res.stderr
    assert re.search(r"this run ended at .* ago\), ok \(exit code 0\); below are its ranks' last records", res.stderr)
    assert res.stdout.count("before the run ended): it was in collective #4") == 2, res.stdout


def test_stacks_of_ranks_whose_processes_are_gone_without_a_summary_says_so(tmp_path: Path) -> None:
    """One more of the kind: a launcher killed hard leaves no summary.json, and its ranks' records
    looked alive (or, once old, stuck in C code). Processes gone from this host are history too."""
    folder = tmp_path / "progress"
    for rank in (0, 1):
        env = clean_env(MLDIST_PROGRESS_DIR=str(folder), MLDIST_RANK=str(rank), MLDIST_SIZE="2")
        subprocess.run([PY, ENDED, "0"], env=env, check=True, timeout=30, capture_output=True)
    res = mldist(["stacks", str(folder)], timeout=30)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [
        f"mldist stacks: {folder}: no rank is running: their processes are gone and the run left no summary.json "
        "(was its launcher killed?); below are their last records, as they were then"
    ]
    heads = [line for line in res.stdout.splitlines() if line.startswith("rank ")]
    assert len(heads) == 2 and all(
        re.search(r"s ago; its process is gone\): it was in collective #4 allreduce\(sum\)", h) for h in heads
    ), res.stdout
    assert os.path.isdir(folder)


def test_stacks_folds_ranks_at_one_place_and_lists_the_others_and_all_shows_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 ranks on 5 nodes (records through the watch's own code): 19 in one all-reduce with one stack are
    one block, rank 17 elsewhere is listed whole; --all shows every rank by itself."""
    monkeypatch.setattr(nodes, "NODE_SECONDS", 0.0)  # each publish rewrites its node's file
    folder = tmp_path / "progress"
    for r in range(20):
        watch = stall.Watch(r, "mpi", 600, size=20, where=folder, host=f"n{r // 4}",
                            local=tmp_path / f"shm{r // 4}")  # fmt: skip
        watch.end(watch.begin("allreduce(sum)"))
        if r != 17:
            watch.begin("allreduce(sum)")
        watch.publish()
    assert main(["stacks", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"19 ranks \(0-16, 18-19\) in collective #2 allreduce\(sum\) for \d+(-\d+)? s", out[0]), out
    assert out[1].startswith("    tests/observe/test_stacks.py:")
    assert [line for line in out if line.startswith("rank ")] == [
        next(line for line in out if line.startswith("rank 17 (n4, pid "))
    ]
    assert main(["stacks", "--all", str(folder)]) == 0
    assert sum(line.startswith("rank ") for line in capsys.readouterr().out.splitlines()) == 20


def test_stacks_of_a_finished_run_without_records_says_it_ended_and_how(tmp_path: Path) -> None:
    """issue 61: RunLog's rank-0.metrics.json at the top of a run directory made stacks look there for
    records, and say "no rank has written its progress yet; is the job running?" of a run long over."""
    run_dir = tmp_path / "run"
    res = mldist(["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, "-c", "pass"], timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir / "rank-0.metrics.json").write_text("{}\n")
    shown = mldist(["stacks", str(run_dir)], timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert "no rank has written" not in shown.stderr and "exit 0" in shown.stderr, shown.stderr
    assert "the run is over; no progress records were kept" in shown.stderr, shown.stderr
