"""Worker groups of ``mldist run``: the processes of one attempt, their output and signals.

``DirectGroup`` starts every worker itself (TensorFlow's engines find each
other through ``MLDIST_WORKERS``); ``mpiexec.MpiexecGroup`` has mpiexec start
them so they share one MPI world. Both give the supervisor the same handles:
``poll()`` (Popen's return code convention) and ``pid`` (a session leader to signal).

Example::

    group = DirectGroup(cfg, inherited(cfg), restart=0)
    group.start(); ...; group.signal_all(signal.SIGTERM); group.finish()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from ..base import envvalues, joined, nodes, progress, stacks
from ..base.files import atomic_write
from ..base.procs import STARTUP_NOISE, die_with_parent, free_ports
from ..errors import LaunchError
from ..placement import engines, handed
from ..placement.resources import cpu_probe
from .netns import PrivateNetwork
from .output import RunLogs, Sink, is_terminal, tidy
from .procs import cpu_sets, first_failure, say, worker_env

if TYPE_CHECKING:
    from .config import RunConfig
    from .elastic.supervisor import Reform


class Worker(Protocol):
    """One rank as the supervisor sees it."""

    @property
    def pid(self) -> int | None:
        """The worker's session (process group) to signal, once known."""

    def poll(self) -> int | None:
        """None while running; else the exit code (negative: killed by that signal)."""


def pump(
    source: Callable[[], IO[bytes]],
    prefix: bytes,
    out: IO[bytes],
    lock: threading.Lock,
    verbose: bool = True,
    tee: Sink | None = None,
    on_error: Callable[[], None] | None = None,
) -> None:
    """Copy lines from ``source()`` to ``out`` with ``prefix``, whole lines at a time.

    ``source`` is called in the pump's own thread: opening a FIFO blocks until its writer opens it.
    Without ``verbose``, TensorFlow's start-up notices (:data:`STARTUP_NOISE`) are left out.
    ``tee`` (the run directory's ``rank-R.log``) gets every line too, without the prefix.
    ``on_error`` is called for each ``mldist: error`` line (the worker's own last words got through).
    When ``out``'s reader leaves (``mldist run ... | head``), the pump goes on reading, so that the
    worker never blocks on a full pipe, and ``tee`` still gets every line. A line redrawn with ``\\r`` (a
    progress bar) is relayed as its last state, and without colour codes where ``out`` is no terminal
    (``tee`` never gets them): :func:`mldist.launch.output.tidy`.
    """
    stream, reader_left, colour = source(), False, is_terminal(out)
    for raw in iter(stream.readline, b""):
        if not verbose and STARTUP_NOISE.search(raw):
            continue
        if on_error is not None and raw.startswith(ERROR_LINE):
            on_error()
        line = tidy(raw if raw.endswith(b"\n") else raw + b"\n", colour)
        with lock:
            if not reader_left:
                try:
                    out.write(prefix + line)
                    out.flush()
                except BrokenPipeError:
                    reader_left = True  # nothing more to show; the run goes on and ends with its own code
                except OSError:  # the user's own output file is full: the run goes on all the same
                    reader_left = True
            if tee is not None:
                try:
                    tee.write(tidy(line, colour=False) if colour else line)
                    tee.flush()
                except ValueError:  # closed by finish() while a straggler still writes
                    pass
                except OSError:  # a full disk: the output is the job's own, never what ends it
                    tee = None
    stream.close()


#: How a worker's one-line reason for leaving starts (mldist.runtime.watch.leave).
ERROR_LINE = b"mldist: error"
#: Where the launcher tells workers to leave their last words, and which engine it decided.
NOTES, ENGINE = envvalues.NOTES.name, envvalues.ENGINE.name


class Group(ABC):
    """What both kinds of group share: output pumps, log files, signalling, the workers' last words.

    Args:
        cfg: the run configuration; its ``decision`` (the launcher's, handed whole to the workers)
            when the launcher has decided.
        env: the environment the workers inherit (``mldist.launch.local.inherited``).
        restart: how many times the group was started before.
        reform: the re-forming of an elastic world that led to this group (None: a first start or a
            fixed world's restart).
    """

    def __init__(self, cfg: RunConfig, env: Mapping[str, str], restart: int = 0, reform: Reform | None = None) -> None:
        self.cfg = cfg
        self.env = env
        self.restart = restart
        self.engine = cfg.decision.name if cfg.decision is not None else ""
        #: The whole decision, which the workers take where it fits them (:mod:`mldist.placement.handed`).
        decided, asked = cfg.decision, cfg.communication
        self.handed = handed.sent(decided, engines.requested_engine(asked, env)) if decided is not None else ""
        #: Each rank's last words (``note-R``), in a directory only this user can read.
        self.notes = tempfile.mkdtemp(prefix="mldist-notes-")
        #: The run directory's ``rank-R.log`` files (a full disk stops them, said once; the run goes on).
        self.run_logs = RunLogs(cfg.run_dir, cfg.nprocs)
        self.said: set[int] = set()  # ranks whose own output showed their "mldist: error" line
        self.run_id = uuid.uuid4().hex[:12]
        self.procs: list[Worker] = []
        self.pumps: list[threading.Thread] = []
        self.logs: list[IO[bytes]] = []
        self.lock = threading.Lock()
        #: Elastic runs: when the supervisor saw the first failure; the lines naming lost or failed
        #: hosts; the re-forming that started this group (None for a first start).
        self.failed_at: float | None = None
        self.named_lines: list[str] = []
        self.reform = reform
        #: Signals for ranks whose pid was not known yet (a shim records it just after the start).
        self.pending: dict[int, list[int]] = {}
        #: Where the workers publish their progress (:mod:`mldist.base.progress`): the run directory's
        #: progress/, which stays for ``mldist stacks`` after the run, else the notes directory.
        self.progress = Path(cfg.run_dir).resolve() / "progress" if cfg.run_dir else Path(self.notes)
        for stale in self.progress.glob("rank-*.json"):  # an earlier attempt's, in a reused run directory
            stale.unlink(missing_ok=True)
        joined.clear(self.progress)

    @abstractmethod
    def start(self) -> None:
        """Start every worker (raises LaunchError if they cannot start)."""

    def blame(self, rank: int, code: int, early: list[int]) -> str:
        """How the group's first failure is reported (``early``: ranks that had ended with 0 before)."""
        return first_failure(rank, code, early)

    def launch_env(self) -> dict[str, str]:
        """What every worker gets from the group: the decided engine, the notes and progress directories,
        and the start-up hook on ``PYTHONPATH`` (:mod:`mldist.base.joined`)."""
        return {
            NOTES: self.notes,
            progress.FOLDER_ENV: str(self.progress),
            **joined.with_hook(self.env),
            **({ENGINE: self.engine, handed.HANDED: self.handed} if self.engine else {}),
        }

    def show_progress(self) -> None:
        """Print where every rank is (``mldist run`` on SIGQUIT): its collective and its frames, ranks at one
        place with the same frames folded as ``mldist stacks`` folds them (over 8 ranks), every rank by itself in
        the run directory's ``stacks.txt``; the run goes on."""
        records, now = progress.read(self.progress), time.time()
        lines = stacks.grouped(records, lambda record: progress.describe(record, now), now)
        if len(records) > stacks.FOLD_ABOVE:
            lines.append(f"every rank by itself: {self._every_rank(records, now)}")
        missing = [r for r in range(self.cfg.nprocs) if r not in records]
        if missing:
            lines.append(f"no progress from rank(s) {', '.join(map(str, missing))} yet ({progress.NO_RECORD})")
        with self.lock:
            sys.stderr.write("".join(f"mldist run: {line}\n" for line in lines))
            sys.stderr.flush()

    def _every_rank(self, records: Mapping[int, progress.Record], now: float) -> str:
        """Where every rank's block went: ``RUN_DIR/stacks.txt``, else the command that shows it."""
        command = f"mldist stacks --all {self.progress}"
        if not self.cfg.run_dir:
            return command
        text = "".join(f"{line}\n" for record in records.values() for line in progress.describe(record, now))
        try:
            return str(atomic_write(Path(self.cfg.run_dir) / "stacks.txt", text, mode=0o644))
        except OSError as exc:
            return f"{command} (cannot write stacks.txt: {exc.strerror})"

    def last_words(self, rank: int) -> str:
        """The one line rank ``rank`` left in the notes directory ("" if none)."""
        try:
            return Path(self.notes, f"note-{rank}").read_text(errors="replace").strip()
        except OSError:
            return ""

    def show_last_words(self) -> None:
        """Print each rank's last words that its own output did not show (fd 2 redirected), and log them."""
        for rank in range(len(self.procs)):
            words = self.last_words(rank)
            if not words or rank in self.said:
                continue
            with self.lock:
                with contextlib.suppress(OSError):
                    sys.stderr.buffer.write(f"[{rank}] {words}\n".encode())
                    sys.stderr.buffer.flush()
                self.run_logs.write(rank, f"{words}\n".encode())

    def cpu_sets(self) -> list[list[int]] | None:
        """Per-rank CPU sets for ``--cpu-bind cores``, else None."""
        return cpu_sets(cpu_probe().allowed, self.cfg.nprocs) if self.cfg.cpu_bind == "cores" else None

    def add_pumps(self, rank: int, stdout: Callable[[], IO[bytes]], stderr: Callable[[], IO[bytes]]) -> None:
        """Relay a worker's stdout and stderr, each line prefixed ``[rank]``."""
        prefix = f"[{rank}] ".encode()
        tee = self.run_logs.log(rank) if self.cfg.run_dir else None  # the run directory's copy, unprefixed
        for src, dst in ((stdout, sys.stdout.buffer), (stderr, sys.stderr.buffer)):
            args = (src, prefix, dst, self.lock, self.cfg.verbose, tee, lambda r=rank: self.said.add(r))
            t = threading.Thread(target=pump, args=args, daemon=True)
            t.start()
            self.pumps.append(t)

    def signal_all(self, sig: int, only_running: bool = True) -> None:
        """Send ``sig`` to every worker's session (only to those still running, by default).

        A rank whose pid is not known yet gets it from :meth:`deliver_pending`.
        """
        for rank, proc in enumerate(self.procs):
            if only_running and proc.poll() is not None:
                continue
            pid = proc.pid
            if pid is None:
                self.pending.setdefault(rank, []).append(sig)
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def deliver_pending(self) -> None:
        """Send queued signals to ranks whose pid became known (the supervisor calls this each round)."""
        for rank in list(self.pending):
            pid = self.procs[rank].pid
            if pid is not None:
                for sig in self.pending.pop(rank):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, sig)

    net: PrivateNetwork | None = None
    #: What listens on this host's network without the private namespace (the warning names it).
    listener = "TensorFlow's unauthenticated server"

    def _network(self) -> PrivateNetwork | None:
        """The private network of the workers (and mpiexec), per ``cfg.network``; says once what it chose.

        Everything that listens for the workers (TensorFlow's gRPC server; Open MPI's launcher, whose
        listeners bind every interface) is then reachable only from inside: loopback and shared memory.
        """
        cfg = self.cfg
        if cfg.network == "host" or cfg.nprocs == 1:
            return None
        got = PrivateNetwork.start()
        if isinstance(got, PrivateNetwork):
            if self.restart == 0:
                say(
                    "workers share a private network namespace (loopback only: nothing outside reaches what "
                    "listens for them; no other network in it: --network host to allow)"
                )
            return got
        if cfg.network == "private":
            raise LaunchError(f"--network private: no private network namespace here ({got})")
        if self.restart == 0:
            say(f"warning: {self.listener} is reachable on this host's network ({got})")
        return None

    def finish(self) -> None:
        """Kill leftovers of every worker's session (e.g. grandchildren) and close the logs."""
        self.signal_all(signal.SIGKILL, only_running=False)
        deadline = time.monotonic() + 2
        for t in self.pumps:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.show_last_words()
        nodes.remove_local(self.progress)  # this host's records in /dev/shm: a killed rank leaves its own
        shutil.rmtree(self.notes, ignore_errors=True)
        self.run_logs.close()
        for log in self.logs:
            with contextlib.suppress(OSError):
                log.close()
        net = getattr(self, "net", None)
        if net is not None:
            net.close()


class DirectGroup(Group):
    """Workers started by the launcher itself, one session each (in a private network when asked)."""

    def start(self) -> None:
        """Start every worker; raises LaunchError (after killing the started ones) if one cannot start."""
        cfg = self.cfg
        self.net = self._network()
        command = self.net.enter(cfg.command) if self.net else list(cfg.command)
        workers = [f"127.0.0.1:{p}" for p in free_ports(cfg.nprocs)]
        sets = self.cpu_sets()
        if cfg.log_dir:
            os.makedirs(cfg.log_dir, exist_ok=True)
        for rank in range(cfg.nprocs):
            env = worker_env(self.env, cfg, rank, workers, self.run_id, self.restart) | self.launch_env()
            if sets:
                env.setdefault("OMP_NUM_THREADS", str(len(sets[rank])))
            out: int | IO[bytes] = subprocess.PIPE
            if cfg.log_dir:
                out = open(os.path.join(cfg.log_dir, f"rank-{rank}.log"), "ab")  # noqa: SIM115
                self.logs.append(out)
            try:
                proc = subprocess.Popen(
                    command,
                    env=env,
                    stdin=None if rank == 0 else subprocess.DEVNULL,  # the launcher's input is rank 0's, as mpirun's
                    stdout=out,
                    stderr=subprocess.STDOUT if cfg.log_dir else subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except OSError as exc:
                self.signal_all(signal.SIGKILL)
                raise LaunchError(f"cannot start {cfg.command[0]!r}: {exc.strerror}") from None
            if sets:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(proc.pid, sets[rank])
            self.procs.append(proc)
            if not cfg.log_dir:
                stdout, stderr = proc.stdout, proc.stderr
                assert stdout is not None and stderr is not None
                self.add_pumps(rank, lambda s=stdout: s, lambda s=stderr: s)  # type: ignore[misc]
