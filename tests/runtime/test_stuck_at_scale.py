"""issue 61: a real ``mldist run -n 32`` of a numpy-only script with one rank stuck names it, with its line,
within the timeout + 30 s, and the progress records are opened at most 4 x 32 times during the stall
(about 32 x 32 before: every waiting rank read every record, every second)."""

from __future__ import annotations

import datetime
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import PY, WORKERS, clean_env, tail

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
