"""One rank of ``mldist run`` when mpiexec starts the workers: ``python -m mldist.launch.shim RUN_DIR -- CMD``.

mpiexec gives each rank its MPI identity; the launcher still supervises every
worker itself. The shim starts the worker command in its own session with its
output on the launcher's pipes (``out-R``/``err-R`` FIFOs, or ``rank-R.log``),
records the worker's pid (so the launcher signals it directly) and its exit code
(so the launcher names the rank and passes the code through), forwards signals,
and always exits 0 so that mpiexec never tears the job down on its own: the
launcher's all-or-nothing rules and grace periods decide.

Example::

    mpiexec -n 2 python -m mldist.launch.shim /tmp/mldist-run-x -- python train.py
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from ..base import envvalues, joined
from ..base.files import atomic_write
from ..base.procs import die_with_parent
from ..placement import common, detect
from .procs import FORWARDED

#: The launcher passes per-rank CPU sets (``--cpu-bind cores``) as "0,1;2,3".
CPU_SETS = envvalues.CPU_SETS.name


def _outputs(run_dir: Path, rank: int, log_dir: str | None) -> tuple[IO[bytes], IO[bytes] | int]:
    if log_dir:
        log = open(Path(log_dir) / f"rank-{rank}.log", "ab")  # noqa: SIM115 - the child inherits it
        return log, subprocess.STDOUT
    # Opening a FIFO for writing blocks until the launcher reads it: the launcher opened it first.
    return open(run_dir / f"out-{rank}", "wb"), open(run_dir / f"err-{rank}", "wb")


def _input(rank: int) -> IO[bytes] | int:
    """Rank 0's standard input: the launcher's own, as mpirun gives it (``echo hi | mldist run ...``); the others'
    is empty. Read through ``/proc``, on this host: Open MPI 5's forwarding of stdin loses it."""
    launcher = envvalues.LAUNCHER_PID.read(os.environ)
    if rank != 0 or launcher is None:
        return subprocess.DEVNULL
    try:  # O_NOCTTY: a terminal never becomes the shim's controlling terminal
        return open(os.open(f"/proc/{launcher}/fd/0", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC), "rb")
    except OSError:
        return subprocess.DEVNULL


def _bind(rank: int) -> None:
    sets = os.environ.pop(CPU_SETS, "")
    if sets:
        cpus = {int(c) for c in sets.split(";")[rank].split(",")}
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
        os.environ.setdefault("OMP_NUM_THREADS", str(len(cpus)))


def main(argv: list[str]) -> int:
    """Run one rank; returns 0 after writing the worker's exit code (or 2 on a usage error)."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m mldist.launch.shim RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    die_with_parent()  # mpiexec gone (e.g. the launcher was killed): go too
    os.environ.pop(joined.SKIP_ENV, None)  # the worker gets the start-up hook
    run_dir, command = Path(argv[0]), argv[2:]
    me = detect(os.environ)  # mpiexec's variables
    rank = me.rank
    _bind(rank)
    os.environ.update(  # what workers of `mldist run` get either way (see procs.worker_env)
        {
            envvalues.RANK.name: str(rank),
            envvalues.SIZE.name: str(me.size),
            envvalues.LOCAL_RANK.name: str(me.local_rank),
            envvalues.LOCAL_SIZE.name: str(me.local_size),
            envvalues.NODE_RANK.name: "0",
        }
    )
    workers = envvalues.WORKERS.read(os.environ) or ()
    os.environ.update(common.for_tools(os.environ, rank, me.size, me.local_rank, me.local_size, workers))
    out, err = _outputs(run_dir, rank, envvalues.LOG_DIR.read(os.environ))
    try:
        child = subprocess.Popen(
            command,
            stdin=_input(rank),
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    except OSError as exc:
        atomic_write(run_dir / f"exit-{rank}", f"127 {time.monotonic()} cannot start {command[0]!r}: {exc.strerror}\n")
        return 0
    atomic_write(run_dir / f"pid-{rank}", f"{child.pid}\n")

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    for s in FORWARDED:
        signal.signal(s, forward)
    code = child.wait()
    # The time lets the launcher tell which rank failed first when several end at once.
    atomic_write(run_dir / f"exit-{rank}", f"{code} {time.monotonic()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
