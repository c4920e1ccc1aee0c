"""The local launcher behind ``mldist run``: N workers on this host, supervised.

All-or-nothing, like torchrun: if one worker fails, the others get SIGTERM
and, after a short grace, SIGKILL; the group's exit code is the first
failing worker's. Signals to the launcher are forwarded to every worker.
Each worker runs in its own session, so its whole process tree is
signalled and nothing is left behind.

The run configuration lives in :mod:`mldist.launch.config` and the process
utilities in :mod:`mldist.launch.procs`; their names are re-exported here, where
callers have always imported them from.

The launcher reads its own process environment once, in :func:`inherited`, and passes
that mapping down; ``RunConfig.env`` is what the workers get beyond it.

Example:
    >>> cfg = RunConfig(nprocs=2, command=("python", "train.py"), communication="ring")
    >>> decision, kind = launch_plan(cfg, {})
    >>> decision.name, kind.__name__
    ('ring', 'DirectGroup')
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import time
import uuid
from collections.abc import Mapping

from ..base import joined
from ..errors import REFORM_CODE, REQUEUE_CODE, ConfigError, LaunchError
from ..placement import common, engines
from ..placement.resources import thread_plan
from . import elastic
from .allocated import GROUPS, SRUN_STARTED, NodefileGroup
from .config import MAX_WORKERS, NETWORKS, RunConfig, command_problem, ensure_descriptors, prepare_log_dir
from .groups import DirectGroup, Group
from .mpiexec import MpiexecGroup, check_mpi_args, find_mpiexec
from .procs import FORWARDED, STOPPING, cpu_sets, describe, exit_code, say, worker_env
from .remote import LOST_HOST_CODE, RemoteGroup, answering_hosts
from .rundir import Record

#: The supervisor's names and, re-exported, those of config and procs that callers import from here.
__all__ = [
    "FORWARDED",
    "MAX_WORKERS",
    "NETWORKS",
    "RunConfig",
    "cpu_sets",
    "ensure_descriptors",
    "group_kind",
    "inherited",
    "launch_plan",
    "prepare_log_dir",
    "run",
    "worker_env",
]


def run(cfg: RunConfig) -> int:
    """Start the workers, supervise them, and return the group's exit code.

    With ``cfg.max_restarts``, a failed group is started again (fresh ports,
    ``MLDIST_RESTART`` counting up) so that a script using
    ``mldist.keras.Checkpoint`` resumes from its last checkpoint. SIGQUIT (Ctrl-\\) prints
    where every rank is, its collective and its frames, and the run goes on.

    Args:
        cfg: what to run.

    Example::

        code = run(RunConfig(nprocs=2, command=("python", "train.py"), max_restarts=2))
    """
    cfg, env, kind, record = _prepare(cfg)
    received: list[int] = []
    current: list[Group] = []
    code: int | None = None

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if current:
            current[-1].signal_all(signum)

    def on_quit(_signum: int, _frame: object) -> None:
        if current:
            current[-1].show_progress()

    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    old[signal.SIGQUIT] = signal.signal(signal.SIGQUIT, on_quit)  # as the JVM's thread dump: print, go on
    failures: list[str] = []
    reforms: list[elastic.Reform] = []
    never = ""  # the never-formed line (mldist.base.joined), decided once for the console and the record
    try:
        while True:
            group = kind(cfg, env, restart=len(failures))
            group.reform = reforms[-1] if reforms else None
            current.append(group)
            code, failure, never = _round(cfg, group, received, env)
            nxt = _next_round(cfg, group, code, failure, failures, reforms, received, env)
            if nxt is None:
                break
            cfg = nxt
        return _formed(code, never, env)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if cfg.elastic is not None and code != 0:
            elastic.forget((h for g in current for h, _ in g.cfg.hosts), env)
        if record is not None:
            reformed = [r.record() for r in reforms]
            record.end(code, current[-1].procs if current else [], max(len(current) - 1, 0), received, never, reformed)


def _round(cfg: RunConfig, group: Group, received: list[int], env: Mapping[str, str]) -> tuple[int, str | None, str]:
    """Start the group and supervise it to its end: (exit code, first failure, the never-formed line).

    An elastic run with a discovery script watches it meanwhile (:class:`mldist.launch.elastic.Watch`).
    """
    watch = elastic.Watch(cfg, env, group.restart) if cfg.elastic is not None and cfg.elastic.discovery else None
    try:
        if group.restart and cfg.elastic is None and _over_ssh(cfg):  # a restart: has a host gone meanwhile?
            try:
                answering_hosts(cfg, env)
            except LaunchError as exc:
                say(str(exc))
                return LOST_HOST_CODE, str(exc), ""
        group.start()
        if watch is not None:
            watch.start()
        code, failure = _supervise(cfg, group, received)
        # Asked only of a run that succeeded (a failed one said why already), before the notes directory goes.
        return code, failure, joined.line(joined.read(group.progress), cfg.nprocs) if code == 0 else ""
    finally:
        if watch is not None:
            watch.stop()
        group.finish()


def _next_round(
    cfg: RunConfig,
    group: Group,
    code: int,
    failure: str | None,
    failures: list[str],
    reforms: list[elastic.Reform],
    received: list[int],
    env: Mapping[str, str],
) -> RunConfig | None:
    """After a round: the next one's config (the same world restarted, or a re-formed elastic one), or
    None to end. ``failures`` and ``reforms`` grow with each new round."""
    stopping = any(s in STOPPING for s in received)
    if failure is None or code == REQUEUE_CODE or stopping:
        return None
    failures.append(failure)
    if cfg.elastic is not None and code == REFORM_CODE:  # the workers left at a commit for hosts that joined
        nxt, done = elastic.grow(cfg, env, len(reforms), group.failed_at or time.monotonic())
        reforms.append(done)
        return nxt
    if cfg.elastic is not None:  # re-form on the hosts that remain, or end
        seen = group.failed_at or time.monotonic()
        asked_to_stop = lambda: any(s in STOPPING for s in received)  # noqa: E731
        nxt, done = elastic.reform(cfg, group.named_lines, env, asked_to_stop, len(reforms), seen)
        reforms.append(done)
        return nxt
    if len(failures) > cfg.max_restarts:
        if cfg.max_restarts:
            say(f"giving up after {cfg.max_restarts} restart(s); failures: " + "; ".join(failures))
        return None
    say(f"restarting the group ({len(failures)} of {cfg.max_restarts}) after: {failure}")
    return cfg


def _formed(code: int, never: str, env: Mapping[str, str]) -> int:
    """The run's exit code after saying that its workers never formed a group (``never``: the line, or "").
    ``MLDIST_REQUIRE_GROUP=1`` makes it an error."""
    if not never:
        return code
    if joined.required(env):
        say(f"error: {never}; failing the run ({joined.REQUIRE_ENV}=1, --require-group)")
        return 1
    say(f"{never}; --require-group makes this an error")
    return code


def _prepare(cfg: RunConfig) -> tuple[RunConfig, dict[str, str], type[Group], Record | None]:
    """Before any worker starts: the checks, the engine decision (carried in the config from here on),
    the workers' environment, how they start, and the run directory's record."""
    if cfg.log_dir:
        prepare_log_dir(cfg.log_dir)
    ensure_descriptors(cfg.nprocs)
    env = inherited(cfg)
    decision, kind = launch_plan(cfg, env)
    cfg.check_backend(decision)
    if not cfg.hosts and (problem := command_problem(cfg.command[0], env.get("PATH"))):
        raise LaunchError(problem)  # a directory, a script without +x: said before anything starts
    if cfg.mpi_args and kind in (MpiexecGroup, RemoteGroup, NodefileGroup) and (found := find_mpiexec(env)):
        check_mpi_args(found, cfg.mpi_args, env)
    cfg = dataclasses.replace(cfg, decision=decision)
    if _over_ssh(cfg):  # before anything starts: mpiexec would wait for ever on a host that does not answer
        cfg = answering_hosts(cfg, env)
    if cfg.elastic is not None:  # the workers' commits of this run, on each host (mldist.horovod.elastic)
        cfg = dataclasses.replace(cfg, env={**cfg.env, elastic.RUN_ENV: uuid.uuid4().hex[:16]})
        env = {**env, elastic.RUN_ENV: cfg.env[elastic.RUN_ENV]}
    if cfg.cpu_bind == "none" and not cfg.hosts:  # bound or remote workers size their threads from their CPUs
        note = thread_plan(env, cfg.nprocs).note  # e.g. an OMP_NUM_THREADS=1 inherited from the shell
        if note:
            say(f"note: {note}")
    if kept := common.kept_note(env):
        say(f"note: {kept}")
    if cfg.nprocs > 1 and (strategy := common.strategy_note(env, decision.traits.runs_tensorflow)):
        say(f"note: {strategy}")
    started_by = "mpiexec" if kind is MpiexecGroup else "direct"
    return cfg, env, kind, Record(cfg, started_by, env) if cfg.run_dir else None


def _over_ssh(cfg: RunConfig) -> bool:
    """Whether mpiexec reaches the hosts of ``cfg`` over ssh (``-H``, ``--hostfile``; not an allocation's)."""
    return bool(cfg.hosts) and cfg.allocation is None


def inherited(cfg: RunConfig) -> dict[str, str]:
    """The environment the workers inherit: this process's, plus ``cfg.env``.

    The launcher's one read of ``os.environ`` (tests/test_layout.py keeps it so): everything
    it decides and starts takes this mapping, and its own environment stays as it was.

    Example:
        >>> inherited(RunConfig(nprocs=2, command=("python",), env={"KERAS_BACKEND": "jax"}))["KERAS_BACKEND"]
        'jax'
    """
    return {**os.environ, **cfg.env}


def launch_plan(cfg: RunConfig, env: Mapping[str, str]) -> tuple[engines.Decision, type[Group]]:
    """The engine, decided by :func:`mldist.placement.engines.decide_with` from what this host shows, and
    how the workers start: through mpiexec when they must form one MPI world, else directly.

    The workers get the decision in ``MLDIST_ENGINE`` and check it against what they see.

    Args:
        cfg: what to run.
        env: the workers' inherited environment (:func:`inherited`).
    """
    decision = engines.decide_with(
        cfg.communication,
        env,
        rank=0,
        size=cfg.nprocs,
        launcher="mldist",
        gpu=engines.gpu_device_nodes(),
        mpi=lambda: _world_to_form(cfg.nprocs, env),
    )
    if cfg.allocation is not None and cfg.allocation.scheduler in SRUN_STARTED:  # srun reaches the nodes itself
        return decision, GROUPS[cfg.allocation.scheduler]
    if cfg.hosts:  # mpiexec starts them whatever the engine: it is the only way onto the other hosts
        if isinstance(world := _world_to_form(cfg.nprocs, env), str):
            job = cfg.allocation
            who = f"inside {job.scheduler} job {job.job_id}, mpiexec" if job is not None else "-H/--hostfile: mpiexec"
            raise ConfigError(f"{who} starts the workers on the other hosts, but {world} (or --local: this node only)")
        return decision, GROUPS[cfg.allocation.scheduler] if cfg.allocation is not None else RemoteGroup
    return decision, MpiexecGroup if decision.mpi_world else DirectGroup


def group_kind(cfg: RunConfig, env: Mapping[str, str]) -> type[Group]:
    """How the workers of ``cfg`` start (see :func:`launch_plan`)."""
    return launch_plan(cfg, env)[1]


def _world_to_form(nprocs: int, env: Mapping[str, str]) -> engines.MpiWorld | str:
    """The MPI world mpiexec would give the workers, or why there would be none."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'mldist[cpu]')"
    found = find_mpiexec(env)
    if found is None:
        return "no mpiexec beside Python or on PATH (pip install 'mldist[cpu]')"
    return engines.MpiWorld(0, nprocs, f"mpiexec {found}")


def _finished(group: Group, pending: set[int]) -> list[tuple[int, int]]:
    """(rank, code) of the ranks that ended since the last look, in :func:`failure_order`."""
    done = [(rank, code) for rank in sorted(pending) if (code := group.procs[rank].poll()) is not None]
    return failure_order(done, {rank: getattr(group.procs[rank], "finished_at", 0.0) for rank, _ in done})


def failure_order(done: list[tuple[int, int]], finished_at: Mapping[int, float]) -> list[tuple[int, int]]:
    """Ranks that ended between two looks, the likely first failure first: by time where the group
    knows it (mpiexec's reports), then a rank killed by a signal before one that exited, then by rank.

    A killed rank cannot have died of its peers' failure, while an exit code can follow one (a
    collective aborted because a peer died): under load both can end between two looks.

    Example:
        >>> failure_order([(0, 1), (1, -9)], {0: 0.0, 1: 0.0})
        [(1, -9), (0, 1)]
    """
    return sorted(done, key=lambda rc: (finished_at.get(rc[0], 0.0), rc[1] >= 0, rc[0]))


def _supervise(cfg: RunConfig, group: Group, received: list[int]) -> tuple[int, str | None]:
    """Wait for every worker; the group's exit code and its first failure, if any."""
    first_failure: tuple[int, str] | None = None
    first_nonzero: int | None = None
    deadline: float | None = None
    pending = set(range(cfg.nprocs))
    early: list[int] = []  # ranks that ended with 0 while others still ran
    while pending:
        if deadline is None and any(s in STOPPING for s in received):
            sig = next(s for s in received if s in STOPPING)
            say(f"got {signal.Signals(sig).name}; workers have {cfg.grace:g} s to exit")
            deadline = time.monotonic() + cfg.grace
        group.deliver_pending()
        for rank, code in _finished(group, pending):
            pending.discard(rank)
            if code == 0:
                early.append(rank)
                continue
            if first_nonzero is None:
                first_nonzero = exit_code(code)
            if first_failure is None and deadline is None and code == REFORM_CODE and cfg.elastic is not None:
                # Every rank leaves at the same commit for the hosts that joined: no failure, no signal.
                group.failed_at = time.monotonic()
                first_failure = (REFORM_CODE, "the workers left at a commit for the hosts that joined")
                deadline = time.monotonic() + cfg.grace
            elif first_failure is None and deadline is None:
                group.failed_at = time.monotonic()
                first_failure = (exit_code(code), group.blame(rank, code, early))
                say(f"{first_failure[1]}; stopping the other workers")
                group.signal_all(signal.SIGTERM)
                # Exit 75: the others are saving a checkpoint too; give them the full grace.
                deadline = time.monotonic() + (cfg.grace if code == REQUEUE_CODE else cfg.failure_grace)
            elif first_failure is None:
                say(describe(rank, code))
        if deadline is not None and time.monotonic() > deadline and pending:
            say(f"killing ranks {sorted(pending)} after the grace period")
            group.signal_all(signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    if first_failure is not None:
        return first_failure[0], first_failure[1]
    return first_nonzero or 0, None
