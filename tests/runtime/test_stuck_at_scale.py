"""issue 61: a real ``mldist run -n 32`` of a numpy-only script with one rank stuck names it, with its line,
within the timeout + 30 s, and the progress records are opened at most 4 x 32 times during the stall
(about 32 x 32 before: every waiting rank read every record, every second); SIGQUIT to ``mldist run`` folds
the ranks at one place."""

from __future__ import annotations

import datetime
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, WORKERS, clean_env, tail
from mldist.base.stacks import ranges

pytestmark = pytest.mark.slow

SIZE, STUCK, TIMEOUT = 32, 17, 10
WORKER = WORKERS / "stuck_numpy.py"
LINE = next(i for i, line in enumerate(WORKER.read_text().splitlines(), 1) if "# stuck here" in line)
#: A record of the progress folder (a node's file, a rank's) or of node-local memory, opened to be read.
RECORD = re.compile(r'openat\(AT_FDCWD, "[^"]*/(?:node-[^"/]+\.rec|rank-\d+\.json|rank-\d+\.rec)", O_RDONLY')


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_one_stuck_rank_of_32_is_named_in_time_and_the_records_are_read_once(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    env = clean_env(MLDIST_COLLECTIVE_TIMEOUT=str(TIMEOUT), MLDIST_STRAGGLER_PERCENT="0")
    argv = ["strace", "-f", "--seccomp-bpf", "-e", "trace=openat", "-tt", "-o", str(trace),
            PY, "-m", "mldist", "run", "-n", str(SIZE), "--run-dir", str(tmp_path / "run"), "--",
            PY, str(WORKER), str(STUCK)]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    ended = datetime.datetime.now().timestamp()
    output = res.stdout + res.stderr
    assert res.returncode != 0 and "UNREACHABLE" not in output, tail(res)
    ready = [float(line.split()[-1]) for line in res.stdout.splitlines() if "READY" in line]
    assert len(ready) == SIZE, tail(res)
    named = re.search(rf"rank {STUCK} has not reached collective #4 allreduce\(sum\) after \d+ s: .*", output)
    assert named and f"stuck_numpy.py:{LINE}" in named.group(0), tail(res)
    assert ended - max(ready) <= TIMEOUT + 30, f"{ended - max(ready):.0f} s from the stall to the end\n{tail(res)}"
    day = datetime.date.today()
    opens = 0
    for line in trace.read_text().splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and RECORD.search(parts[2]):
            when = datetime.datetime.combine(day, datetime.time.fromisoformat(parts[1])).timestamp()
            opens += when >= max(ready)
    assert opens <= 4 * SIZE, f"{opens} opens of progress records during the stall"


def test_sigquit_to_mldist_run_folds_ranks_at_one_place_and_keeps_every_rank_in_the_run_dir(tmp_path: Path) -> None:
    """10 real ranks, rank 3 stuck before the fourth all-reduce: SIGQUIT prints one block for the 9 that wait
    and rank 3 by itself (as ``mldist stacks`` folds them), and every rank's block goes to RUN_DIR/stacks.txt."""
    size, stuck, run_dir, err = 10, 3, tmp_path / "run", tmp_path / "stderr.txt"
    argv = [PY, "-m", "mldist", "run", "-n", str(size), "--run-dir", str(run_dir), "--", PY, str(WORKER), str(stuck)]
    with err.open("w") as sink:
        launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=sink, text=True, env=clean_env())
    try:
        assert launcher.stdout is not None
        ready = 0
        while ready < size and (line := launcher.stdout.readline()):
            ready += " READY " in line
        assert ready == size, err.read_text()[-3000:]
        time.sleep(4)  # every rank's record published (node files once a second)
        launcher.send_signal(signal.SIGQUIT)
        deadline = time.monotonic() + 60
        while "every rank by itself" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        finally:
            launcher.kill()
    said = [line for line in err.read_text().splitlines() if line.startswith("mldist run: ")]
    folded = f"mldist run: 9 ranks ({ranges(r for r in range(size) if r != stuck)}) in collective #4 allreduce(sum)"
    assert any(line.startswith(folded) for line in said), said
    assert sum(line.startswith(f"mldist run: rank {stuck} (") for line in said) == 1, said
    assert not any(re.match(r"mldist run: rank (?!3 )\d+ \(", line) for line in said), said
    assert f"mldist run: every rank by itself: {run_dir / 'stacks.txt'}" in said, said
    kept = (run_dir / "stacks.txt").read_text()
    assert all(f"rank {r} (" in kept for r in range(size)) and f"stuck_numpy.py:{LINE}" in kept, kept
