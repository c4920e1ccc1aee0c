"""What ``mldist run`` does with its standard input and its ``runs/`` folder, as mpirun users expect.

Real launches of 2 plain Python workers (no TensorFlow), through mpiexec and directly.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import PY, clean_env, tail

READER = "import os, sys\nprint(f\"rank {os.environ['MLDIST_RANK']} read {sys.stdin.read()!r}\", flush=True)\n"


@pytest.mark.parametrize("engine", ["mpi", "ring"])
def test_standard_input_goes_to_rank_0_and_the_others_read_nothing(tmp_path: Path, engine: str) -> None:
    """``echo hi | mldist run -n 2 -- python s.py``: the input was dropped (every rank read /dev/null)."""
    script = tmp_path / "s.py"
    script.write_text(READER)
    cmd = [PY, "-m", "mldist", "run", "-n", "2", "--no-run-dir", "--communication", engine, "--", PY, str(script)]
    res = subprocess.run(cmd, input="hi\nthere\n", capture_output=True, text=True, env=clean_env(), timeout=120)
    assert res.returncode == 0, tail(res)
    assert "[0] rank 0 read 'hi\\nthere\\n'" in res.stdout and "[1] rank 1 read ''" in res.stdout, tail(res)


def test_a_refused_run_leaves_no_runs_folder(tmp_path: Path) -> None:
    """A run refused before it starts (a command that does not exist) made an empty ``runs/`` all the same."""
    env = clean_env()
    del env["MLDIST_RUNS_DIR"]  # the default: runs/ in the working directory
    cmd = [PY, "-m", "mldist", "run", "-n", "2", "--", str(tmp_path / "no-such-program")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert res.returncode == 2 and "no-such-program" in res.stderr, tail(res)
    assert not (tmp_path / "runs").exists()
    ok = subprocess.run([PY, "-m", "mldist", "run", "-n", "1", "--", "true"], capture_output=True, text=True,
                        env=env, timeout=60, cwd=tmp_path)  # fmt: skip
    assert ok.returncode == 0 and len(list((tmp_path / "runs").iterdir())) == 1, tail(ok)  # a run that starts has one
