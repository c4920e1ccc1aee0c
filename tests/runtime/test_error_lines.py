"""A rank's one line says what went wrong: an error inside a traced function, Ctrl-C, a bad JAX variable.

Real ``mldist run -n 2`` launches; each test failed before its fix (a 20-line traceback per rank, or a
summary that read ``raised TypeError: in user code:``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, clean_env, mldist, tail

pytestmark = pytest.mark.slow

TRACED = """import mldist, tensorflow as tf
ctx = mldist.init()
@tf.function
def step(x):
    fns = [1, 2]
    return fns(x)
step(tf.constant(1.0))
"""


def _rank_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"\[[01]\] mldist: error", line)]


def test_an_error_inside_a_tf_function_is_summed_up_by_its_own_line_and_the_users_frame(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRACED)
    res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "train.py"], cwd=tmp_path, timeout=180)
    assert res.returncode == 1, tail(res)
    said = _rank_lines(res.stdout + res.stderr)
    assert said, tail(res)
    for line in said:  # each rank that spoke before the launcher stopped it
        assert line[4:] == (
            f"mldist: error (rank {line[1]}): raised TypeError: 'list' object is not callable (at train.py:6)"
        ), said


def test_ctrl_c_ends_each_rank_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    script, out = tmp_path / "wait.py", tmp_path / "out.txt"
    script.write_text("import time, mldist\nmldist.init()\nprint('READY', flush=True)\ntime.sleep(120)\n")
    with open(out, "w") as sink:
        argv = [PY, "-m", "mldist", "run", "-n", "2", "--no-run-dir", "--", PY, str(script)]
        env = clean_env()
        launcher = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 150
            while out.read_text().count("READY") < 2 and time.monotonic() < deadline and launcher.poll() is None:
                time.sleep(0.2)
            assert out.read_text().count("READY") == 2, out.read_text()[-3000:]
            os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the launcher's process group
            code = launcher.wait(timeout=60)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
    text = out.read_text()
    assert code == 130 and "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert sorted(_rank_lines(text)) == [
        f"[{r}] mldist: error (rank {r}): stopped by SIGINT (Ctrl-C)" for r in (0, 1)
    ], text[-3000:]


def test_a_jax_count_in_other_digits_with_jaxs_own_initialize_is_one_line(tmp_path: Path) -> None:
    """``JAX_NUM_PROCESSES=²`` and ``jax.distributed.initialize()`` (no mldist.init): a 24-line traceback on rank 0."""
    (tmp_path / "jx.py").write_text("import jax\njax.distributed.initialize()\nprint('UNREACHABLE', flush=True)\n")
    env = clean_env(KERAS_BACKEND="jax", JAX_NUM_PROCESSES="\u00b2")
    res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "jx.py"], cwd=tmp_path, env=env, timeout=180)
    assert res.returncode == 2 and "UNREACHABLE" not in res.stdout, tail(res)
    assert "Traceback" not in res.stderr, tail(res)
    line = "mldist: error: JAX_NUM_PROCESSES='\u00b2' is not a whole number: unset it, or set it to this worker's value"
    said = [ln for ln in res.stderr.splitlines() if re.match(r"\[[01]\] ", ln)]
    other = "mldist: error: rank {} ended on an error before it joined the group"  # a rank that saw its peer fail
    assert line in [ln[4:] for ln in said], tail(res)
    assert all(ln[4:] == line or ln[4:].startswith(other.format(1 - int(ln[1]))) for ln in said), tail(res)
