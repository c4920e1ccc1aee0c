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

from helpers import PY, ROOT, clean_env, tail

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
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    res = subprocess.run([PY, STARTUP, *args], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert res.returncode == 2, tail(res)
    (line,) = res.stderr.splitlines()
    assert res.stdout == "" and line.startswith("startup.py: error: ") and message in line, line
