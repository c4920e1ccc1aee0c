"""One rank of ``mldist run`` when mpiexec starts the workers: ``python -I -S .../launch/shim.py RUN_DIR -- CMD``.

mpiexec gives each rank its MPI identity; the launcher still supervises every
worker itself. The shim starts the worker command in its own process group with its
output on the launcher's pipes (``out-R``/``err-R`` FIFOs, or ``rank-R.log``),
records the worker's pid (so the launcher signals it directly) and its exit code
(so the launcher names the rank and passes the code through), forwards signals,
and always exits 0 so that mpiexec never tears the job down on its own: the
launcher's all-or-nothing rules and grace periods decide.

There is one shim per rank, so it does only what a process of the rank must: it
learns its rank from mpiexec, then reads ``RUN_DIR/start-R``, everything else the
launcher worked out once before mpiexec started
(:func:`mldist.launch.mpiexec.start_file`). It imports nothing beyond the standard
library's ``os``, ``_signal`` (the C module under ``signal``), ``sys``, ``time`` (and
``ctypes`` for the parent-death signal): no mldist, no ``subprocess``, no ``contextlib`` and
not ``signal`` itself, whose imports bring ``collections``, ``functools`` and ``enum`` (28 ->
16-19 ms of CPU a shim, ``perf stat -r 30``). It runs as ``python -I -S`` (no site, no
start-up hook, no ``PYTHONPATH``); it took 85 ms when it imported mldist to set the rank up itself.

Example::

    mpiexec -n 2 python -I -S .../mldist/launch/shim.py /tmp/mldist-run-x -- python train.py
"""

from __future__ import annotations

import _signal as signal  # (the C module: signal.py's enums bring enum, functools, collections: 3.5 ms)
import os
import sys
import time

#: mpiexec's rank variable, by MPI (the first one set wins): the MPI launchers' rows of
#: ``mldist.placement.detect.LAUNCHERS``, spelled here because importing mldist would cost every rank
#: (tests/launch/test_shim.py keeps the two alike).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PALS_RANKID", "PMI_RANK", "ALPS_APP_PE")
#: Signals passed on to the worker's session (``mldist.launch.procs.FORWARDED``; the same test keeps them alike).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: Signals that Python ignores and ``exec`` would keep ignored: the worker gets them back (as subprocess does).
_RESTORED = ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (mpiexec's, or the shim's, for the worker)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # not Linux, no libc: the launcher's own watch stops the workers
        pass


def rank_of(env: dict[str, str] | os._Environ[str]) -> int | None:
    """This rank, from mpiexec's variables; None when none is set.

    Example:
        >>> rank_of({"PMI_RANK": "3"}), rank_of({})
        (3, None)
    """
    for name in RANK_VARIABLES:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def read_start(path: str) -> tuple[list[str], list[int], dict[str, str]]:
    """The launcher's ``start-R`` file: ``OUT, ERR, IN`` paths, the CPUs to run on, and the worker's variables.

    NUL-separated: ``OUT``, ``ERR`` ("" when the worker's stderr joins OUT, a rank log opened to append),
    ``IN``, the CPUs (``0,1``, "" for no binding), then ``NAME=value`` entries.
    """
    with open(path, "rb") as fh:
        fields = [os.fsdecode(f) for f in fh.read().split(b"\0")]
    cpus = [int(c) for c in fields[3].split(",") if c]
    return fields[:3], cpus, dict(entry.split("=", 1) for entry in fields[4:] if entry)


def _open_streams(paths: list[str]) -> tuple[int, int, int]:
    """The worker's stdin, stdout and stderr. A FIFO's open blocks until the launcher reads it (it opened it first).

    Rank 0's stdin is the launcher's own (``/proc/PID/fd/0``, as mpirun gives it; Open MPI 5's forwarding
    loses it); O_NOCTTY: a terminal never becomes the shim's controlling terminal. Any other: /dev/null.
    """
    out_path, err_path, in_path = paths
    if err_path:
        out = os.open(out_path, os.O_WRONLY | os.O_CLOEXEC)
        err = os.open(err_path, os.O_WRONLY | os.O_CLOEXEC)
    else:  # a rank log: both streams, appended
        out = err = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
    try:
        stdin = os.open(in_path, os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:  # the launcher's stdin is a socket, or it is gone
        stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return stdin, out, err


def _exec_child(command: list[str], fds: tuple[int, int, int], report: int) -> None:
    """In the forked child: a process group of its own, the parent-death signal, the streams, then the command.

    A group, not a session: the launcher signals the group, and a new session would also be a new
    scheduling autogroup (``/proc/sys/kernel/sched_autogroup_enabled``, on in most distributions),
    each of which gets an equal share of the CPUs. With more ranks than cores, 64 workers in 64
    autogroups left the shims that start the last ones (all in mpiexec's one) a 65th of the machine:
    ranks started over 7 s instead of 1, and ``mldist run -n 64`` took 2.4x a bare ``mpirun``.
    A failed exec writes its errno to ``report`` (closed on exec) and exits 127; never returns.
    """
    try:
        os.setpgid(0, 0)
        die_with_parent()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)  # (dup2's copy is inheritable; the originals close on exec)
        for name in _RESTORED:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        _close_others(report)
        os.execvp(command[0], command)
    except Exception as exc:  # (a name with a NUL: ValueError)
        os.write(report, str(getattr(exc, "errno", None) or 22).encode())
    finally:
        os._exit(127)


def _close_others(keep: int) -> None:
    """Close every descriptor above 2 but ``keep``: the worker gets only its three streams (subprocess's
    ``close_fds``). The list of open ones, not a loop to the descriptor limit (which may be 1,048,576)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd != keep:
            try:  # noqa: SIM105  (no contextlib here: see the module's docstring)
                os.close(fd)
            except OSError:  # (the listing's own descriptor, closed already)
                pass


def start(command: list[str], fds: tuple[int, int, int]) -> int:
    """Fork and exec ``command`` (see :func:`_exec_child`); its pid. OSError when it cannot start."""
    readable, report = os.pipe()  # both close on exec: EOF alone means the exec succeeded
    pid = os.fork()
    if pid == 0:
        os.close(readable)
        _exec_child(command, fds, report)
    os.close(report)
    with os.fdopen(readable, "rb") as fh:
        failed = fh.read()
    if failed:
        os.waitpid(pid, 0)
        errno = int(failed)
        raise OSError(errno, os.strerror(errno))
    return pid


def note(path: str, text: str) -> None:
    """``text`` in ``path`` whole: written beside it, then renamed (the launcher polls for it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    """Run one rank; returns 0 after writing the worker's exit code (or 2 on a usage error)."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -I -S shim.py RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    die_with_parent()  # mpiexec gone (e.g. the launcher was killed): go too
    run_dir, command, rank = argv[0], argv[2:], rank_of(os.environ)
    if rank is None:
        print(f"mldist shim: none of {', '.join(RANK_VARIABLES)} is set: this mpiexec gives no rank", file=sys.stderr)
        return 2
    paths, cpus, env = read_start(os.path.join(run_dir, f"start-{rank}"))
    if cpus:
        try:  # noqa: SIM105
            os.sched_setaffinity(0, cpus)  # the worker inherits it
        except OSError:
            pass
    for name, value in env.items():  # mpiexec's own values win (an --mca the user gave), as before
        os.environ.setdefault(name, value)
    fds = _open_streams(paths)
    try:
        pid = start(command, fds)
    except OSError as exc:
        note(
            os.path.join(run_dir, f"exit-{rank}"),
            f"127 {time.monotonic()} cannot start {command[0]!r}: {exc.strerror}\n",
        )
        return 0
    note(os.path.join(run_dir, f"pid-{rank}"), f"{pid}\n")

    def forward(signum: int, _frame: object) -> None:
        try:  # noqa: SIM105
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    # The time lets the launcher tell which rank failed first when several end at once.
    note(os.path.join(run_dir, f"exit-{rank}"), f"{code} {time.monotonic()}\n")
    return 0  # (the streams stay open until here: once the launcher reads EOF, the exit note is there)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
