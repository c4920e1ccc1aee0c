"""Node-local records (mldist.base.nodes): a rank killed with SIGKILL leaves no folder in /dev/shm behind, whether
the node's last rank or the launcher cleans up; a live rank's record is never taken from it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from helpers import PY, clean_env, mldist
from mldist.base import nodes

#: One rank of a node: publishes its record, says READY, waits for a line, then leaves as a rank does at exit.
RANK = """
import os, sys, time
from pathlib import Path
from mldist.base import nodes
shared, local, rank = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
node = nodes.Node(shared, local, "h", defer=False)
node.publish(rank, {"rank": rank, "pid": os.getpid()}, time.time())
print("READY", flush=True)
sys.stdin.readline()
node.forget(rank)
node.close()
print("LEFT", flush=True)
"""


def _rank(tmp_path: Path, rank: int) -> subprocess.Popen[str]:
    shared, local = tmp_path / "progress", tmp_path / "shm" / "progress-x"
    proc = subprocess.Popen([PY, "-c", RANK, str(shared), str(local), str(rank)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=clean_env())  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


def _leave(proc: subprocess.Popen[str]) -> None:
    out, _ = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0 and "LEFT" in out, out


def test_the_last_rank_of_a_node_removes_the_folder_that_a_killed_rank_left(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    local = tmp_path / "shm" / "progress-x"
    first, killed = _rank(tmp_path, 0), _rank(tmp_path, 1)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert (local / "rank-1.rec").exists()  # SIGKILL: no exit handler removed it
    _leave(first)
    assert not local.exists(), sorted(p.name for p in local.iterdir())


def test_a_live_ranks_record_keeps_the_folder_until_it_leaves(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    local = tmp_path / "shm" / "progress-x"
    first, second = _rank(tmp_path, 0), _rank(tmp_path, 1)
    _leave(first)
    assert sorted(p.name for p in local.iterdir()) == ["node.lock", "rank-1.rec"]
    _leave(second)
    assert not local.exists()


def test_a_record_held_or_of_a_live_pid_or_just_made_is_not_abandoned(tmp_path: Path) -> None:
    held = nodes.Slot(tmp_path / "rank-0.rec", held=True)
    held.put(nodes.encode({"rank": 0, "pid": 2**22 + 1}))  # no such pid, but its rank holds the lock
    assert not nodes.abandoned(held.path)
    held.close()
    assert nodes.abandoned(held.path)
    (tmp_path / "rank-1.rec").write_bytes(nodes.encode({"rank": 1, "pid": os.getpid()}))
    (tmp_path / "rank-2.rec").write_bytes(b"")
    assert not nodes.abandoned(tmp_path / "rank-1.rec") and not nodes.abandoned(tmp_path / "rank-2.rec")


def test_remove_local_takes_only_that_runs_folder(tmp_path: Path) -> None:
    mine, other = tmp_path / "a" / "progress", tmp_path / "b" / "progress"
    for shared in (mine, other):
        folder = nodes.local_folder(shared, tmp_path / "shm")
        folder.mkdir(parents=True)
        (folder / "rank-3.rec").write_bytes(b"x")
    nodes.remove_local(mine, tmp_path / "shm")
    assert not nodes.local_folder(mine, tmp_path / "shm").exists()
    assert (nodes.local_folder(other, tmp_path / "shm") / "rank-3.rec").exists()


#: A rank that checks its record is in node-local memory, then rank 1 dies of SIGKILL.
KILLED = """
import os, signal, time
import numpy as np
import mldist
from mldist.base import nodes, progress
ctx = mldist.init()
mldist.allreduce(np.ones(2))
local = nodes.local_folder(progress.folder(os.environ))
for _ in range(100):
    if (local / f"rank-{ctx.rank}.rec").exists():
        break
    time.sleep(0.1)
print("RECORD", (local / f"rank-{ctx.rank}.rec").exists(), local, flush=True)
mldist.allreduce(np.ones(2))
if ctx.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(1)
"""


def test_a_run_whose_rank_was_killed_leaves_nothing_in_node_local_memory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = mldist(["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, "-c", KILLED], env=clean_env(), timeout=180)
    assert res.returncode != 0, res.stderr[-2000:]
    said = [line.split() for line in res.stdout.splitlines() if " RECORD " in line]
    assert len(said) == 2 and all(words[2] == "True" for words in said), res.stdout[-2000:]
    local = Path(said[0][3])
    assert local == nodes.local_folder((run_dir / "progress").resolve())
    deadline = time.monotonic() + 5
    while local.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not local.exists(), sorted(p.name for p in local.iterdir())


def test_no_timer_thread_starts_once_the_rank_is_leaving(tmp_path: Path) -> None:
    """A record that is not due waits for a timer thread; at exit none may start (a thread started as Python 3.11
    ends runs on its torn-down state: a rank died with SIGSEGV in ``_PyThreadState_SetCurrent``)."""
    (tmp_path / "progress").mkdir()
    for leave in ("_at_exit", "forget"):
        node = nodes.Node(tmp_path / "progress", tmp_path / "shm" / leave, "h")
        node.publish(0, {"rank": 0}, time.time())  # the node's file written now
        node.publish(0, {"rank": 0}, time.time())  # not due for a second: a timer
        assert node._timer is not None
        node._at_exit() if leave == "_at_exit" else node.forget(1)
        before = threading.active_count()
        node._timer = None  # (as when the timer fired)
        node.publish(0, {"rank": 0}, time.time() + 0.01)
        assert node._timer is None and threading.active_count() <= before
        node.close()
