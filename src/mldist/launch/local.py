"""The local launcher behind ``mldist run``: N workers on this host.

All-or-nothing, like torchrun: if one worker fails, the others get SIGTERM
and, after a short grace, SIGKILL; the group's exit code is the first
failing worker's. Signals to the launcher are forwarded to every worker.
Each worker runs in its own session, so its whole process tree is
signalled and nothing is left behind.

Example:
    >>> cfg = RunConfig(nprocs=2, command=("python", "train.py"))
    >>> sorted(worker_env({}, cfg, 1, ("127.0.0.1:5000", "127.0.0.1:5001"), "r1"))[:3]
    ['MLDIST_COMMUNICATION', 'MLDIST_LAUNCHER_PID', 'MLDIST_LOCAL_RANK']
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import REQUEUE_CODE, ConfigError, LaunchError
from .groups import DirectGroup, Group
from .rundir import Record

#: Signals forwarded to every worker. INT/TERM also start the grace period.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
COMMUNICATIONS = ("auto", "mpi", "ring", "nccl")
NETWORKS = ("auto", "private", "host")


@dataclass(frozen=True)
class RunConfig:
    """What ``mldist run`` was asked to do.

    Args:
        nprocs: number of workers.
        command: argv of each worker.
        log_dir: write ``rank-R.log`` files here instead of prefixed output.
        grace: seconds workers get after a forwarded SIGINT/SIGTERM.
        failure_grace: seconds the others get after one worker failed.
        cpu_bind: "none", or "cores" to give each worker its own CPUs.
        max_restarts: restart the whole group this many times after a worker
            failure (not after exit code 75 or a signal to the launcher).
        communication: the workers' engine: "auto" and "mpi" start them through
            mpiexec when one is found (one MPI world), "ring"/"nccl" start them directly.
        network: for workers started directly (TensorFlow's engines): "private" runs them in
            a network namespace of their own, "host" on this host's network, "auto" private
            where the platform allows it.
        verbose: show TensorFlow's start-up notices too (hidden by default: every rank repeats them).
        profile_steps: "A:B" to record a timeline of those steps on every rank (``MLDIST_PROFILE_STEPS``).
        run_dir: the run directory (config.json, rank-R.log, summary.json; ``MLDIST_RUN_DIR``
            for the workers), or None for none; see :mod:`mldist.launch.rundir`.
    """

    nprocs: int
    command: tuple[str, ...]
    log_dir: str | None = None
    grace: float = 60.0
    failure_grace: float = 5.0
    cpu_bind: str = "none"
    max_restarts: int = 0
    communication: str = "auto"
    network: str = "auto"
    verbose: bool = False
    profile_steps: str | None = None
    run_dir: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.nprocs <= MAX_WORKERS:
            raise ConfigError(f"-n {self.nprocs}: start 1 to {MAX_WORKERS} workers on one host")
        if not self.command:
            raise ConfigError("no command given: mldist run -n 2 -- python train.py")
        for name, value in (("--grace", self.grace), ("--failure-grace", self.failure_grace)):
            if not 0 <= value <= 7 * 86400:  # also refuses nan and inf: a kill must follow
                raise ConfigError(f"{name} {value}: give 0 to 604800 seconds")
        if self.cpu_bind not in ("none", "cores"):
            raise ConfigError(f"--cpu-bind {self.cpu_bind!r}: use 'none' or 'cores'")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts} cannot be negative")
        if self.network not in NETWORKS:
            raise ConfigError(f"--network {self.network!r} is not one of {', '.join(NETWORKS)}")
        if self.communication not in COMMUNICATIONS:
            raise ConfigError(f"--communication {self.communication!r} is not one of {', '.join(COMMUNICATIONS)}")


#: The most workers ``mldist run`` starts on one host.
MAX_WORKERS = 4096
#: Descriptors the launcher holds per worker (output pipes, FIFOs, ports while choosing), and for itself.
_FDS_PER_WORKER, _FDS_BASE = 6, 64


def prepare_log_dir(path: str) -> None:
    """Create ``--log-dir`` (owner-only) or raise ConfigError saying why it cannot hold the logs."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--log-dir {path!r} is a file; name a directory")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--log-dir {path!r} cannot be created ({exc.strerror}); name a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--log-dir {path!r} is not writable; name a writable directory")


def ensure_descriptors(nprocs: int) -> None:
    """Raise the soft open-file limit as far as needed for ``nprocs`` workers, or refuse with the reason."""
    need = _FDS_BASE + _FDS_PER_WORKER * nprocs
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise LaunchError(
        f"-n {nprocs} needs about {need} open files but this shell allows {hard} (ulimit -Hn); "
        f"start at most {(hard - _FDS_BASE) // _FDS_PER_WORKER} workers or raise the limit"
    )


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that are free now (all held open while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cpu_sets(cpus: Sequence[int], n: int) -> list[list[int]]:
    """Split this process's CPUs into ``n`` contiguous sets (shared if too few).

    Example:
        >>> cpu_sets([0, 1, 2, 3], 2)
        [[0, 1], [2, 3]]
        >>> cpu_sets([0, 1], 4)
        [[0], [0], [1], [1]]
    """
    if len(cpus) >= n:
        per = len(cpus) // n
        return [list(cpus[i * per : (i + 1) * per]) for i in range(n)]
    return [[cpus[i * len(cpus) // n]] for i in range(n)]


def worker_env(
    base: Mapping[str, str], cfg: RunConfig, rank: int, workers: Sequence[str], run_id: str, restart: int = 0
) -> dict[str, str]:
    """The environment of worker ``rank``: what ``mldist.placement.detect`` reads.

    Args:
        base: the launcher's environment.
        cfg: the run configuration.
        rank: the worker's rank.
        workers: ``host:port`` of every worker.
        run_id: identifies this run (also in ``MLDIST_RUN_ID``).
        restart: how many times the group was restarted (``MLDIST_RESTART``).
    """
    env = dict(base)
    for stale in ("TF_CONFIG", "MLDIST_RUN_DIR"):
        env.pop(stale, None)
    env.update(
        MLDIST_COMMUNICATION=cfg.communication,
        MLDIST_RANK=str(rank),
        MLDIST_SIZE=str(cfg.nprocs),
        MLDIST_LOCAL_RANK=str(rank),
        MLDIST_LOCAL_SIZE=str(cfg.nprocs),
        MLDIST_NODE_RANK="0",
        MLDIST_WORKERS=",".join(workers),
        MLDIST_RUN_ID=run_id,
        MLDIST_RESTART=str(restart),
        MLDIST_LAUNCHER_PID=str(os.getpid()),  # workers stop if it dies (mldist.runtime.watchdog)
    )
    if cfg.profile_steps:
        env["MLDIST_PROFILE_STEPS"] = cfg.profile_steps
    if cfg.run_dir:
        env["MLDIST_RUN_DIR"] = os.path.abspath(cfg.run_dir)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # TensorFlow's C++ INFO lines, once per rank, bury the training output; yours win.
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return env


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _describe(rank: int, returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"rank {rank} was killed by {name} (exit code {128 - returncode})"
    return f"rank {rank} exited with code {returncode}"


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (runs between fork and exec)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _say(message: str) -> None:
    print(f"mldist run: {message}", file=sys.stderr, flush=True)


def run(cfg: RunConfig) -> int:
    """Start the workers, supervise them, and return the group's exit code.

    With ``cfg.max_restarts``, a failed group is started again (fresh ports,
    ``MLDIST_RESTART`` counting up) so that a script using
    ``mldist.keras.Checkpoint`` resumes from its last checkpoint.

    Args:
        cfg: what to run.

    Example::

        code = run(RunConfig(nprocs=2, command=("python", "train.py"), max_restarts=2))
    """
    if cfg.log_dir:
        prepare_log_dir(cfg.log_dir)
    ensure_descriptors(cfg.nprocs)
    received: list[int] = []
    current: list[Group] = []
    kind = group_kind(cfg, os.environ)
    record = Record(cfg, "mpiexec" if kind.__name__ == "MpiexecGroup" else "direct") if cfg.run_dir else None
    code: int | None = None

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if current:
            current[-1].signal_all(signum)

    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    failures: list[str] = []
    try:
        while True:
            group = kind(cfg, restart=len(failures))
            current.append(group)
            try:
                group.start()
                code, failure = _supervise(cfg, group, received)
            finally:
                group.finish()
            retry = failure is not None and code != REQUEUE_CODE and not any(s in _STOPPING for s in received)
            if not retry or failure is None:
                break
            failures.append(failure)
            if len(failures) > cfg.max_restarts:
                if cfg.max_restarts:
                    _say(f"giving up after {cfg.max_restarts} restart(s); failures: " + "; ".join(failures))
                break
            _say(f"restarting the group ({len(failures)} of {cfg.max_restarts}) after: {failure}")
        return code
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if record is not None:
            record.end(code, current[-1].procs if current else [], max(len(current) - 1, 0), received)


def group_kind(cfg: RunConfig, env: Mapping[str, str]) -> type[Group]:
    """Through mpiexec for the MPI engine ("mpi", or "auto" on a CPU host with mpi4py and mpiexec), else directly."""
    from .mpiexec import MpiexecGroup, find_mpiexec

    if cfg.communication == "mpi":
        return MpiexecGroup
    if cfg.communication != "auto" or _has_gpu() or importlib.util.find_spec("mpi4py") is None:
        return DirectGroup
    return MpiexecGroup if find_mpiexec(env) else DirectGroup


def _has_gpu() -> bool:
    # Without importing TensorFlow (4 s): NVIDIA's or AMD's kernel driver exposes device nodes.
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")


def _finished(group: Group, pending: set[int]) -> list[tuple[int, int]]:
    """(rank, code) of the ranks that ended since the last look, earliest first where known."""
    done = [(rank, code) for rank in sorted(pending) if (code := group.procs[rank].poll()) is not None]
    return sorted(done, key=lambda rc: getattr(group.procs[rc[0]], "finished_at", 0.0))


def _supervise(cfg: RunConfig, group: Group, received: list[int]) -> tuple[int, str | None]:
    """Wait for every worker; the group's exit code and its first failure, if any."""
    first_failure: tuple[int, str] | None = None
    first_nonzero: int | None = None
    deadline: float | None = None
    pending = set(range(cfg.nprocs))
    while pending:
        if deadline is None and any(s in _STOPPING for s in received):
            sig = next(s for s in received if s in _STOPPING)
            _say(f"got {signal.Signals(sig).name}; workers have {cfg.grace:g} s to exit")
            deadline = time.monotonic() + cfg.grace
        group.deliver_pending()
        for rank, code in _finished(group, pending):
            pending.discard(rank)
            if code == 0:
                continue
            if first_nonzero is None:
                first_nonzero = _exit_code(code)
            if first_failure is None and deadline is None:
                first_failure = (_exit_code(code), _describe(rank, code))
                _say(f"{first_failure[1]}; stopping the other workers")
                group.signal_all(signal.SIGTERM)
                # Exit 75: the others are saving a checkpoint too; give them the full grace.
                deadline = time.monotonic() + (cfg.grace if code == REQUEUE_CODE else cfg.failure_grace)
            elif first_failure is None:
                _say(_describe(rank, code))
        if deadline is not None and time.monotonic() > deadline and pending:
            _say(f"killing ranks {sorted(pending)} after the grace period")
            group.signal_all(signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    if first_failure is not None:
        return first_failure[0], first_failure[1]
    return first_nonzero or 0, None
