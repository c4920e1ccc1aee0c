"""benchmarks/startup.py at small sizes: its parts run and give figures, a bad flag is one line.

The full benchmark (``--ranks 16,32,64``, TensorFlow and JAX workers under strace) takes minutes; here
a numpy worker's start is counted and ``mldist run -n 2`` is timed against a bare ``mpirun -n 2``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import PY, ROOT, cannot_here, clean_env, tail

STARTUP = str(ROOT / "benchmarks" / "startup.py")


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (apt-get install strace)")
def test_the_benchmark_counts_a_numpy_workers_start_and_times_a_small_launch(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    args = ["--parts", "files,launch", "--cases", "numpy", "--ranks", "2", "--rounds", "1", "--json", str(out)]
    res = subprocess.run([PY, STARTUP, *args], capture_output=True, text=True, env=clean_env(), timeout=600)
    assert res.returncode == 0, tail(res)
    rows = json.loads(out.read_text())
    (files,) = rows["files"]
    # A numpy worker's start without TensorFlow: about 2,800 path calls here, 34,500 when init imported it.
    assert files["case"] == "numpy" and 500 < files["calls"] < 8000, files
    assert 0 < files["open"] < files["calls"] and files["cpu_s"] > 0, files
    (launch,) = rows["launch"]
    assert launch["ranks"] == 2 and launch["mldist_s"] > 0 and launch["mpirun_s"] > 0, launch
    assert "### files" in res.stdout and "| numpy |" in res.stdout and "### launch" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--parts", "files,lunch"], "'lunch' is not a part; use files,launch"),
        (["--cases", "torch"], "'torch' is not a case; use numpy,tensorflow,jax"),
        (["--ranks", "0"], "'0': give rank counts such as 16,32,64"),
        (["--rounds", "none"], "'none': give 1 or more"),
        (["--hosts", "40"], "'40': give 1 to 32 test hosts"),
        (["--only", "run32"], "invalid choice: 'run32' (choose from 'run64', 'hosts', 'silent')"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    res = subprocess.run([PY, STARTUP, *args], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert res.returncode == 2, tail(res)
    (line,) = res.stderr.splitlines()
    assert res.stdout == "" and line.startswith("startup.py: error: ") and message in line, line


def test_only_silent_runs_the_silent_hosts_check_alone(tmp_path: Path) -> None:
    """``--only silent``: the -H check of silent hosts, alone (64 here; 4,096 by default), one line, exit 2."""
    out = tmp_path / "rows.json"
    args = ["--only", "silent", "--silent", "64", "--json", str(out)]
    res = subprocess.run([PY, STARTUP, *args], capture_output=True, text=True, env=clean_env(), timeout=300)
    if res.returncode != 0 and ("unshare" in res.stderr or "Operation not permitted" in res.stderr):
        cannot_here(f"no network namespace here: {res.stderr.strip()[-200:]}")
    assert res.returncode == 0, tail(res)
    rows = json.loads(out.read_text())
    assert list(rows) == ["silent"], rows  # nothing else ran
    (row,) = rows["silent"]
    assert row["hosts"] == 64 and row["exit_code"] == 2 and row["seconds"] < row["goal_s"] and row["line_chars"] < 300
