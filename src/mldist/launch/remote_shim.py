"""One rank of ``mldist run -H`` on another host: ``python -m mldist.launch.remote_shim -- COMMAND``.

mpiexec starts it over ssh on each host. Nothing there is shared with the
launcher but mpiexec's own channels, so the shim sends everything through them:
the worker's lines on its stdout/stderr prefixed ``[R]`` (mpiexec relays them to
the launcher), the worker's last line when its own stderr did not show it
(``MLDIST_NOTES``, kept on this host), and ``mldist run: rank R ... on HOST`` when
the worker fails. It exits with the worker's code (128+N for signal N), so that
mpiexec ends the job when one rank fails. Signals: mpiexec forwards SIGUSR1 and
SIGUSR2; the launcher sends SIGUSR2 for its SIGTERM, which the shim gives the
worker as SIGTERM (save and exit), and SIGUSR1 as it is.

Example::

    mpiexec --host node1:2,node2:2 -n 4 python -m mldist.launch.remote_shim -- python train.py
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..base import envvalues, joined, progress
from ..base.procs import die_with_parent
from ..placement import common, detect
from .groups import ERROR_LINE, NOTES, pump
from .procs import describe, exit_code, stamp

#: The launcher's SIGTERM reaches the shims as this signal (mpiexec forwards only USR1 and USR2).
TERM_AS = signal.SIGUSR2
#: Signals the shim passes to the worker, and as what.
_PASSED = {TERM_AS: signal.SIGTERM, signal.SIGUSR1: signal.SIGUSR1, signal.SIGTERM: signal.SIGTERM}
#: The run's fence in its progress folder: the round (``MLDIST_RESTART``) the launcher started last.
ROUND_FILE = "round"
#: Seconds between two reads of the fence (one shim per host reads the shared file system), and between two
#: looks of every shim at its host's mark (node-local).
FENCE_EVERY, MARK_EVERY = 5.0, 1.0


def _own_group() -> None:
    """Between fork and exec: a process group of the worker's own (the shim signals it whole) and the
    parent-death signal. A group, not a session: each session is a scheduling autogroup of its own, and
    with more ranks than cores the shims still starting ranks got a sliver of the CPUs (launch/shim.py)."""
    os.setpgid(0, 0)
    die_with_parent()


def _start(command: list[str], rank: int) -> subprocess.Popen[bytes] | None:
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_own_group,
        )
    except OSError as exc:
        print(f"[{rank}] mldist run: cannot start {command[0]!r} on {socket.gethostname()}: {exc.strerror}", flush=True)
        return None


def _relay(child: subprocess.Popen[bytes], rank: int, said: list[bool]) -> list[threading.Thread]:
    """Pump the worker's output with its ``[R]`` prefix; note whether its own error line got through."""
    verbose, lock = envvalues.VERBOSE.read(os.environ), threading.Lock()
    threads = []
    for src, dst in ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer)):
        args = (lambda s=src: s, f"[{rank}] ".encode(), dst, lock, verbose, None, lambda: said.append(True))
        t = threading.Thread(target=pump, args=args, daemon=True)
        t.start()
        threads.append(t)
    return threads


def main(argv: list[str]) -> int:
    """Run one rank; its exit code (2 on a usage error, 127 if the command cannot start)."""
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python -m mldist.launch.remote_shim -- COMMAND...", file=sys.stderr)
        return 2
    die_with_parent()  # mpiexec's daemon gone: go too
    os.environ.pop(joined.SKIP_ENV, None)  # the worker gets the start-up hook
    me = detect(os.environ)
    rank = me.rank
    coordinator = envvalues.COORDINATOR.read(os.environ) or ""
    os.environ.update(common.for_tools(os.environ, rank, me.size, me.local_rank, me.local_size, (), coordinator))
    notes = tempfile.mkdtemp(prefix="mldist-notes-")
    os.environ[NOTES] = notes
    try:
        child = _start(argv[1:], rank)
        if child is None:
            return 127
        for sig in _PASSED:
            signal.signal(sig, _forwarder(child.pid))
        _fence(child, rank, me.local_rank)
        said: list[bool] = []
        threads = _relay(child, rank, said)
        code = child.wait()
        ended = time.time()  # before the relay's last lines: when the worker ended, to order failures across hosts
        for t in threads:
            t.join(timeout=2)
        _last_words(Path(notes) / f"note-{rank}", rank, bool(said))
        if code:
            at = stamp(ended)
            print(
                f"[{rank}] mldist run: {describe(rank, code)} on {socket.gethostname()} at {at}",
                file=sys.stderr,
                flush=True,
            )
        return exit_code(code)
    finally:
        shutil.rmtree(notes, ignore_errors=True)


def _fence(child: subprocess.Popen[bytes], rank: int, local_rank: int) -> None:
    """Kill the worker once the launcher started a later round: the world re-formed without this host, which
    it no longer reaches (a cut link) while the shared file system still does. The worker must not write
    beside the new world (checkpoints, progress records): SIGKILL, not SIGTERM, which would save.

    The shim of local rank 0 reads the run's :data:`ROUND_FILE` every :data:`FENCE_EVERY` s and marks the
    host (node-local); every shim looks at the mark. A run without a progress folder has no fence.
    """
    where, mine = progress.folder(os.environ), envvalues.RESTART.read(os.environ)
    run = re.sub(r"[^A-Za-z0-9_.-]", "_", envvalues.RUN_ID.read(os.environ) or "")[:64]
    if where is None or not run:
        return
    mark = Path(tempfile.gettempdir()) / f"mldist-fenced-{run}"

    def watch() -> None:
        looked = 0.0
        while child.poll() is None:
            time.sleep(MARK_EVERY)
            if local_rank == 0 and time.monotonic() - looked >= FENCE_EVERY:
                looked = time.monotonic()
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if int((where / ROUND_FILE).read_text().split()[0]) > mine:
                        mark.touch()
            if mark.exists() and child.poll() is None:
                host = socket.gethostname()
                print(
                    f"[{rank}] mldist run: rank {rank} on {host}: the world re-formed without this host (it lost "
                    "the launcher); stopping its worker",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
                return

    threading.Thread(target=watch, daemon=True).start()


def _forwarder(pid: int) -> Callable[[int, object], None]:
    """A signal handler giving the worker's group the signal ``_PASSED`` maps the received one to."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, _PASSED[signal.Signals(signum)])

    return forward


def _last_words(note: Path, rank: int, said: bool) -> None:
    """The worker's one line, when its own stderr did not carry it (redirected fd 2)."""
    with contextlib.suppress(OSError):
        words = note.read_text(errors="replace").strip()
        if words.startswith(ERROR_LINE.decode()) and not said:
            print(f"[{rank}] {words}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
