"""Process utilities of ``mldist run``: worker environments, CPU sets, signals and exit reports.

Shared by the groups that start workers (:mod:`mldist.launch.groups`,
:mod:`mldist.launch.mpiexec`), the per-rank shim and the supervisor
(:mod:`mldist.launch.local`); this module starts nothing itself. Free ports and dying with
the parent, which the tools need too, are in :mod:`mldist.base.procs`.

Example:
    >>> cfg = RunConfig(nprocs=2, command=("python", "train.py"))
    >>> env = worker_env({}, cfg, 1, ("127.0.0.1:5000", "127.0.0.1:5001"), "r1")
    >>> sorted(k for k in env if k.startswith("MLDIST_"))[:3], env["RANK"]
    (['MLDIST_COMMUNICATION', 'MLDIST_CPU_BIND', 'MLDIST_LAUNCHER_PID'], '1')
"""

from __future__ import annotations

import calendar
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence

from ..base import envvalues
from ..base.rundir import RUN_DIR_ENV
from ..placement import common
from ..placement.resources import CPU_BIND_ENV, CpuProbe, cpu_probe, cpus_per_task_from, plan_threads
from .config import RunConfig

#: Signals forwarded to every worker. INT/TERM also start the grace period.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: Forwarded signals that mean "stop": the workers get the grace period and the group is not restarted.
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def cpu_sets(cpus: Sequence[int], n: int) -> list[list[int]]:
    """Split this process's CPUs into ``n`` contiguous sets (shared if too few).

    Args:
        cpus: the CPUs this process may use.
        n: how many sets (one per worker).

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


def run_env(cfg: RunConfig, run_id: str, restart: int) -> dict[str, str]:
    """What every worker of one start of the group gets, however it is started (directly, mpiexec, ssh).

    Args:
        cfg: the run configuration.
        run_id: identifies this run (``MLDIST_RUN_ID``).
        restart: how many times the group was restarted (``MLDIST_RESTART``).

    Example:
        >>> sorted(run_env(RunConfig(nprocs=2, command=("python", "t.py")), "r1", 0))  # no run_dir: none wanted
        ['MLDIST_COMMUNICATION', 'MLDIST_NO_RUN_DIR', 'MLDIST_RESTART', 'MLDIST_RUN_ID']
    """
    env = {
        envvalues.RUN_ID.name: run_id,
        envvalues.RESTART.name: str(restart),
        envvalues.COMMUNICATION.name: cfg.communication,
    }
    if cfg.profile_steps:
        env[envvalues.PROFILE_STEPS.name] = cfg.profile_steps
    if cfg.run_dir:
        env[RUN_DIR_ENV] = os.path.abspath(cfg.run_dir)
    else:  # --no-run-dir: RunLog() must not make one of its own (mldist.keras.runlog.resolve_run_dir)
        env[envvalues.NO_RUN_DIR.name] = "1"
    return env


def binding_env(cfg: RunConfig) -> dict[str, str]:
    """Whether this host's workers share the launcher's CPU mask, for their thread plans.

    Unbound workers inside a CPU set (a container, ``salloc -c 8``) each see the whole set; told so, each
    takes its share rather than all of it (:func:`mldist.placement.resources.plan_threads`).

    Args:
        cfg: the run configuration (``cpu_bind``).

    Example:
        >>> binding_env(RunConfig(nprocs=2, command=("python",)))
        {'MLDIST_CPU_BIND': 'none'}
    """
    return {CPU_BIND_ENV: cfg.cpu_bind}


def threads_env(base: Mapping[str, str], cfg: RunConfig, probe: CpuProbe | None = None) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for workers that share this host's CPUs unbound: each rank's share of them.

    Set at launch, not in ``mldist.init()``: OpenBLAS, MKL and OpenMP size their thread pools when the
    worker imports them, and scripts import numpy first. Unset, each of 64 ranks on 2 cores started
    OpenBLAS's 2 spinning threads, and importing numpy cost 117 ms of CPU instead of 63 (``perf stat``).
    Nothing where the user's environment gives a count (``OMP_NUM_THREADS``, ``SLURM_CPUS_PER_TASK``, ...:
    :func:`mldist.placement.resources.cpus_per_task_from`), where ``--cpu-bind cores`` gives each rank its
    set, or where the share is every CPU (one rank: the libraries take them all anyway).

    Args:
        base: the launcher's environment.
        cfg: the run configuration (``nprocs``, ``cpu_bind``).
        probe: this host's CPUs (default: :func:`mldist.placement.resources.cpu_probe`).

    Example:
        >>> cfg = RunConfig(nprocs=4, command=("python",))
        >>> threads_env({}, cfg, CpuProbe(8, tuple(range(8)))), threads_env({"OMP_NUM_THREADS": "1"}, cfg)
        ({'OMP_NUM_THREADS': '2'}, {})
        >>> threads_env({}, RunConfig(nprocs=1, command=("python",)), CpuProbe(8, tuple(range(8))))
        {}
    """
    if cfg.cpu_bind != "none" or cpus_per_task_from(base) is not None:
        return {}
    p = probe or cpu_probe()
    share = plan_threads(len(p.allowed), p.total, None, cfg.nprocs, shared=True).cpus
    return {"OMP_NUM_THREADS": str(share)} if share < len(p.allowed) else {}


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

    Example:
        >>> cfg = RunConfig(nprocs=2, command=("python", "train.py"))
        >>> worker_env({"TF_CONFIG": "{}"}, cfg, 1, ["h:1", "h:2"], "r1", restart=3)["MLDIST_RESTART"]
        '3'
    """
    env = dict(base)
    for stale in ("TF_CONFIG", RUN_DIR_ENV):
        env.pop(stale, None)
    env.update(run_env(cfg, run_id, restart))
    env.update(
        {
            envvalues.RANK.name: str(rank),
            envvalues.SIZE.name: str(cfg.nprocs),
            envvalues.LOCAL_RANK.name: str(rank),
            envvalues.LOCAL_SIZE.name: str(cfg.nprocs),
            envvalues.NODE_RANK.name: "0",
            envvalues.WORKERS.name: ",".join(workers),
            envvalues.LAUNCHER_PID.name: str(os.getpid()),  # workers stop if it dies (mldist.runtime.watch.watchdog)
        }
    )
    env.update(binding_env(cfg) | threads_env(base, cfg))
    env.update(common.for_tools(env, rank, cfg.nprocs, rank, cfg.nprocs, workers))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # TensorFlow's C++ INFO lines, once per rank, bury the training output; yours win.
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return env


def exit_code(returncode: int) -> int:
    """The shell's exit code for a Popen return code (killed by signal N: 128 + N).

    Args:
        returncode: as ``Popen.returncode``: negative when a signal killed the process.

    Example:
        >>> exit_code(3), exit_code(-signal.SIGTERM)
        (3, 143)
    """
    return 128 - returncode if returncode < 0 else returncode


def describe(rank: int, returncode: int) -> str:
    """How rank ``rank`` ended, for the launcher's messages.

    Args:
        rank: the worker's rank.
        returncode: its Popen return code (negative: killed by that signal).

    Example:
        >>> describe(1, -signal.SIGKILL)
        'rank 1 was killed by SIGKILL (exit code 137)'
    """
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"rank {rank} was killed by {name} (exit code {128 - returncode})"
    return f"rank {rank} exited with code {returncode}"


def say(message: str) -> None:
    """Print one of the launcher's own messages on stderr, as ``mldist run: MESSAGE``.

    Args:
        message: the text, without the prefix.

    Example::

        say("restarting the group (1 of 2) after: rank 0 exited with code 1")
    """
    print(f"mldist run: {message}", file=sys.stderr, flush=True)


def first_failure(rank: int, code: int, early: Sequence[int]) -> str:
    """The group's first failure; a rank killed after another had left with exit 0 is said so.

    An MPI launcher stops the job when a rank leaves without MPI_Finalize (even with exit 0):
    then the killed rank is not the one to blame.

    Example:
        >>> first_failure(0, -15, [1])[:50]
        'rank 1 exited with code 0 while the others were st'
    """
    said = describe(rank, code)
    if code < 0 and early:
        return f"rank {early[0]} exited with code 0 while the others were still running, then {said}"
    return said


#: The end of a remote shim's failure line: when its worker ended (UTC, ms), to order failures across hosts.
ENDED_AT = re.compile(r" at ([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3})Z\s*$")


def stamp(when: float) -> str:
    """A wall-clock time as the shims write it: UTC to the millisecond.

    Example:
        >>> stamp(0.25)
        '1970-01-01T00:00:00.250Z'
    """
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"


def ended_at(line: str) -> float:
    """When the worker of a shim's failure line ended (seconds since the epoch), or -inf for a line without it
    (mpiexec's own, which name a lost daemon: they come first).

    Example:
        >>> ended_at("[2] mldist run: rank 2 exited with code 3 on hx3 at 1970-01-01T00:00:01.500Z")
        1.5
    """
    match = ENDED_AT.search(line)
    if match is None:
        return float("-inf")
    return calendar.timegm(time.strptime(match.group(1)[:19], "%Y-%m-%dT%H:%M:%S")) + int(match.group(1)[20:]) / 1000
